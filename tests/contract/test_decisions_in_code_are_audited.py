"""ledger.approve/deny/resolve take the one audited decision path: every attempt,
accepted or refused, is in the audit trail with its principal, the channel
``code`` and a reason code; their 0.2.x answers (True/False, deny's positional
reason) stand, and a refusal that is not "nothing to decide" raises."""

from __future__ import annotations

import pytest

from agent_ledger import EffectDeniedError, EffectStatus, RunOptions, ToolCall
from agent_ledger.approvals import Channel, DecisionAction, DecisionOutcome
from agent_ledger.codes import DecisionCode, ErrorCode
from agent_ledger.core import UNNAMED
from agent_ledger.deciding import approval_store, effect_intent
from agent_ledger.errors import DecisionRefusedError
from agent_ledger.testing import build_ledger
from tests.approvals import make_pending
from tests.harness import StoreHarness

PAY = ToolCall(workflow_id="wf-code", tool="pay", args={"to": "acme", "cents": 900})


async def test_an_approval_in_code_is_audited_with_its_principal_and_intent(
    harness: StoreHarness,
) -> None:
    ledger = build_ledger(harness.store)
    effect = await make_pending(ledger, PAY)
    assert await ledger.approve(effect.idem_key, by="ops@example.com", note="checked")
    assert not await ledger.approve(effect.idem_key, by="late@example.com")
    trail = await approval_store(harness.store).decision_attempts(effect.idem_key)
    assert [(a.principal, a.channel, a.action, a.outcome, a.reason_code) for a in trail] == [
        ("ops@example.com", Channel.CODE, DecisionAction.APPROVE, DecisionOutcome.ACCEPTED,
         DecisionCode.DECIDED),
        ("late@example.com", Channel.CODE, DecisionAction.APPROVE, DecisionOutcome.REFUSED,
         DecisionCode.ALREADY_DECIDED),
    ]  # fmt: skip
    # Bound to the intent of the effect it decided, so the run can check it.
    assert trail[0].intent_hash == effect_intent(effect, None)
    assert trail[0].note == "checked"
    assert await ledger.run(PAY, lambda e: "paid") == "paid"


async def test_a_deny_by_position_is_audited_and_unnamed_code_is_said_so(
    harness: StoreHarness,
) -> None:
    ledger = build_ledger(harness.store)
    effect = await make_pending(ledger, PAY)
    assert await ledger.deny(effect.idem_key, "change freeze")  # 0.2.x: reason by position
    denied = await harness.store.find(effect.idem_key)
    assert denied is not None and denied.decided_by is None  # nobody named, as before
    assert denied.error is not None and denied.error.message == "change freeze"
    (row,) = await approval_store(harness.store).decision_attempts(effect.idem_key)
    assert (row.principal, row.action, row.note) == (UNNAMED, DecisionAction.DENY, "change freeze")
    with pytest.raises(EffectDeniedError, match="change freeze"):
        await ledger.run(PAY, lambda e: "never")


async def test_unknown_keys_and_other_attempts_answer_false_and_are_audited(
    harness: StoreHarness,
) -> None:
    ledger = build_ledger(harness.store)
    effect = await make_pending(ledger, PAY)
    assert not await ledger.approve("no-such-key", by="ops")
    assert not await ledger.approve(effect.idem_key, by="ops", expected_attempt=effect.attempt + 1)
    still = await harness.store.find(effect.idem_key)
    assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
    approvals = approval_store(harness.store)
    assert [a.reason_code for a in await approvals.decision_attempts("no-such-key")] == [
        DecisionCode.UNKNOWN_EFFECT
    ]
    assert [a.reason_code for a in await approvals.decision_attempts(effect.idem_key)] == [
        DecisionCode.ALREADY_DECIDED
    ]


async def test_an_approval_past_its_deadline_raises_and_the_effect_is_denied_as_expired(
    harness: StoreHarness,
) -> None:
    ledger = build_ledger(harness.store, defaults=RunOptions(approval_deadline_ms=1))
    effect = await make_pending(ledger, PAY)
    await harness.age(50)
    if harness.kind not in ("memory", "sqlite"):  # a real clock: let it pass
        import asyncio

        await asyncio.sleep(0.05)
    with pytest.raises(DecisionRefusedError) as refused:
        await ledger.approve(effect.idem_key, by="ops")
    assert refused.value.reason == DecisionCode.EXPIRED.value
    expired = await harness.store.find(effect.idem_key)
    assert expired is not None and expired.status is EffectStatus.DENIED
    assert expired.error is not None and expired.error.code == ErrorCode.APPROVAL_EXPIRED
    (row,) = await approval_store(harness.store).decision_attempts(effect.idem_key)
    assert (row.outcome, row.reason_code) == (DecisionOutcome.REFUSED, DecisionCode.EXPIRED)
    with pytest.raises(EffectDeniedError):
        await ledger.run(PAY, lambda e: "never")
