"""Past its deadline an undecided approval is denied as expired by a sweep; before
that, at ``escalate_after`` of its time, the escalation hook fires once per
request, however many sweepers run at once. A parked effect never expires."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import Effect, EffectDeniedError, EffectStatus, LedgerHooks, RunOptions, ToolCall
from agent_ledger.codes import ErrorCode
from agent_ledger.deciding import EXPIRY_DECIDER, approval_store
from agent_ledger.testing import build_ledger
from tests.approvals import make_parked, make_pending
from tests.harness import StoreHarness

PAY = ToolCall(workflow_id="wf-deadline", tool="pay", args={"to": "acme", "cents": 700})
#: Long enough for the steps before it on a loaded machine, short enough to wait out.
DEADLINE_MS = 1_500


async def pass_time(harness: StoreHarness, ms: int) -> None:
    """Move the store's clock ``ms`` on: a manual clock moves, a server's is waited for."""
    if harness.kind in ("memory", "sqlite"):
        await harness.age(ms)
    else:
        await asyncio.sleep(ms / 1000)


async def test_an_undecided_approval_is_escalated_once_then_denied_as_expired(
    harness: StoreHarness,
) -> None:
    paged: list[Effect] = []

    async def page(effect: Effect) -> None:
        paged.append(effect)

    hooks = LedgerHooks(on_approval_escalation=page, escalate_after=0.5)
    ledger = build_ledger(
        harness.store, defaults=RunOptions(approval_deadline_ms=DEADLINE_MS), hooks=hooks
    )
    effect = await make_pending(ledger, PAY)
    early = await ledger.sweep_approvals()
    assert (early.expired, early.escalated, paged) == ([], [], [])
    await pass_time(harness, DEADLINE_MS * 6 // 10)
    # Three sweepers at once (three processes, one store): the hook fires once.
    sweepers = [build_ledger(harness.store, hooks=hooks) for _ in range(3)]
    swept = await asyncio.gather(*(s.sweep_approvals() for s in sweepers))
    assert sum(len(s.escalated) for s in swept) == 1
    assert [e.idem_key for e in paged] == [effect.idem_key]
    request = await approval_store(harness.store).approval_request(effect.idem_key)
    assert request is not None and request.escalated_at is not None
    assert (await ledger.sweep_approvals()).escalated == []
    assert len(paged) == 1
    waiting = await harness.store.find(effect.idem_key)
    assert waiting is not None and waiting.status is EffectStatus.REQUIRES_APPROVAL
    await pass_time(harness, DEADLINE_MS)
    swept = await asyncio.gather(*(s.sweep_approvals() for s in sweepers))
    assert [e.idem_key for s in swept for e in s.expired] == [effect.idem_key]
    assert len(paged) == 1
    expired = await harness.store.find(effect.idem_key)
    assert expired is not None and expired.status is EffectStatus.DENIED
    assert expired.decided_by == EXPIRY_DECIDER
    assert expired.error is not None and expired.error.code == ErrorCode.APPROVAL_EXPIRED
    with pytest.raises(EffectDeniedError):
        await ledger.run(PAY, lambda e: "never")


async def test_a_decided_approval_is_neither_escalated_nor_expired(harness: StoreHarness) -> None:
    paged: list[Effect] = []
    hooks = LedgerHooks(on_approval_escalation=paged.append, escalate_after=0.1)
    ledger = build_ledger(
        harness.store, defaults=RunOptions(approval_deadline_ms=DEADLINE_MS), hooks=hooks
    )
    effect = await make_pending(ledger, PAY)
    assert await ledger.approve(effect.idem_key, by="ops")
    await pass_time(harness, DEADLINE_MS + 100)
    swept = await ledger.sweep_approvals()
    assert (swept.expired, swept.escalated, paged) == ([], [], [])
    approved = await harness.store.find(effect.idem_key)
    assert approved is not None and approved.status is EffectStatus.READY


async def test_a_failing_escalation_hook_is_logged_and_fires_no_more(
    harness: StoreHarness, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def broken(effect: Effect) -> None:
        calls.append(effect.idem_key)
        raise RuntimeError("pager down")

    hooks = LedgerHooks(on_approval_escalation=broken, escalate_after=0.2)
    ledger = build_ledger(
        harness.store, defaults=RunOptions(approval_deadline_ms=DEADLINE_MS), hooks=hooks
    )
    effect = await make_pending(ledger, PAY)
    await pass_time(harness, DEADLINE_MS // 2)
    assert [e.idem_key for e in (await ledger.sweep_approvals()).escalated] == [effect.idem_key]
    assert (await ledger.sweep_approvals()).escalated == []
    assert calls == [effect.idem_key]
    assert "on_approval_escalation hook raised" in caplog.text


async def test_a_parked_effect_never_expires(harness: StoreHarness) -> None:
    ledger = build_ledger(harness.store, defaults=RunOptions(approval_deadline_ms=DEADLINE_MS))
    pending = await make_pending(ledger, PAY)
    assert await ledger.approve(pending.idem_key, by="ops")
    # It runs, its worker goes silent after the handler started: parked.
    other = ToolCall(workflow_id="wf-deadline", tool="pay", args={"to": "b", "cents": 1})
    parked = await make_parked(ledger, other, harness.age)
    approvals = approval_store(harness.store)
    await approvals.renew_request(
        parked.idem_key, requested_by=None, policy_version=None, deadline_ms=1
    )
    await pass_time(harness, 50)
    assert (await ledger.sweep_approvals()).expired == []
    still = await harness.store.find(parked.idem_key)
    assert still is not None and still.parked
