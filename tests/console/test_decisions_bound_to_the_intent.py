"""A person's decision is bound to the intent they saw, exactly one wins, and every
attempt, accepted or refused, is in the audit trail (issue 28).

Run on every store (``every_store``): each implements ``ApprovalStore.decide``
in its own transaction.
"""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.approvals import (
    Channel,
    DecisionAction,
    DecisionOutcome,
    UsedLink,
    intent_hash,
)
from agent_ledger.codes import DecisionCode, ErrorCode
from agent_ledger.deciding import approval_store, decide, effect_intent, expire_overdue
from agent_ledger.effects import Effect
from agent_ledger.stores.base import Store
from tests.harness import StoreHarness

pytestmark = pytest.mark.every_store

PARK = RunOptions(requires_approval=True, wait_for_approval=False)
PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 12_500}, workflow_id="wf-pay")


async def _pending(harness: StoreHarness) -> tuple[Store, Effect]:
    store = harness.store
    ledger = harness.ledger()
    with pytest.raises(ApprovalPendingError):
        await ledger.run(PAY, lambda e: "paid", PARK)
    effect = await store.find(ledger.idem_key(PAY))
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    return store, effect


async def test_an_approval_with_the_intent_shown_decides_and_is_audited(
    harness: StoreHarness,
) -> None:
    store, effect = await _pending(harness)
    shown = effect_intent(effect, None)
    assert shown == intent_hash(
        tool="pay",
        workflow_id="wf-pay",
        args_canonical=effect.args_canonical,
        policy_version=None,
        attempt=effect.attempt,
    )
    done = await decide(
        store,
        effect.idem_key,
        action=DecisionAction.APPROVE,
        principal="alice@example.com",
        channel=Channel.CONSOLE,
        shown_intent=shown,
        note="looks right",
    )
    assert done.accepted and done.reason is DecisionCode.DECIDED
    assert done.effect is not None and done.effect.status is EffectStatus.READY
    assert done.effect.decided_by == "alice@example.com"
    (row,) = await approval_store(store).decision_attempts(effect.idem_key)
    assert (row.principal, row.channel, row.action, row.outcome, row.reason_code) == (
        "alice@example.com",
        Channel.CONSOLE,
        DecisionAction.APPROVE,
        DecisionOutcome.ACCEPTED,
        DecisionCode.DECIDED,
    )
    assert (row.intent_hash, row.note) == (shown, "looks right")


async def test_another_intent_or_policy_version_decides_nothing(harness: StoreHarness) -> None:
    store, effect = await _pending(harness)
    approvals = approval_store(store)
    await approvals.note_request(
        effect.idem_key, requested_by="worker-1", policy_version="v2", deadline_ms=None
    )
    # What a stale screen showed: the same call under policy v1.
    stale = intent_hash(
        tool="pay",
        workflow_id="wf-pay",
        args_canonical=effect.args_canonical,
        policy_version="v1",
        attempt=effect.attempt,
    )
    other_args = intent_hash(
        tool="pay",
        workflow_id="wf-pay",
        args_canonical='{"cents":1,"to":"acme"}',
        policy_version="v2",
        attempt=effect.attempt,
    )
    for shown in (stale, other_args, None):
        refused = await decide(
            store,
            effect.idem_key,
            action=DecisionAction.APPROVE,
            principal="alice",
            channel=Channel.CONSOLE,
            shown_intent=shown,
        )
        assert not refused.accepted and refused.reason is DecisionCode.INTENT_MISMATCH
    still = await store.find(effect.idem_key)
    assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
    assert still.decided_by is None
    rows = await approvals.decision_attempts(effect.idem_key)
    assert [(r.outcome, r.reason_code) for r in rows] == [
        (DecisionOutcome.REFUSED, DecisionCode.INTENT_MISMATCH)
    ] * 3


async def test_twenty_concurrent_decisions_make_one_transition(harness: StoreHarness) -> None:
    store, effect = await _pending(harness)
    shown = effect_intent(effect, None)
    results = await asyncio.gather(
        *(
            decide(
                store,
                effect.idem_key,
                action=DecisionAction.APPROVE if i % 2 else DecisionAction.DENY,
                principal=f"person-{i}",
                channel=Channel.CONSOLE,
                shown_intent=shown,
            )
            for i in range(20)
        )
    )
    winners = [r for r in results if r.accepted]
    assert len(winners) == 1
    winner = winners[0].effect
    assert winner is not None and winner.decided_by is not None
    losers = [r for r in results if not r.accepted]
    assert len(losers) == 19
    assert all(r.reason is DecisionCode.ALREADY_DECIDED for r in losers)
    assert all(f"already decided by {winner.decided_by} at " in r.message for r in losers)
    rows = await approval_store(store).decision_attempts(effect.idem_key)
    assert sorted(r.outcome.value for r in rows) == ["accepted"] + ["refused"] * 19
    final = await store.find(effect.idem_key)
    assert final is not None and len(final.history) == 1, "one settlement, not twenty"


async def test_a_link_decides_once(harness: StoreHarness) -> None:
    store, effect = await _pending(harness)
    shown = effect_intent(effect, None)
    from datetime import UTC, datetime, timedelta

    link = UsedLink("n" * 32, DecisionAction.APPROVE, datetime.now(UTC) + timedelta(hours=1))
    first, second = await asyncio.gather(
        *(
            decide(
                store,
                effect.idem_key,
                action=DecisionAction.APPROVE,
                principal=who,
                channel=Channel.LINK,
                shown_intent=shown,
                link=link,
            )
            for who in ("bob", "carol")
        )
    )
    assert sorted([first.accepted, second.accepted]) == [False, True]
    loser = second if first.accepted else first
    assert loser.reason in (DecisionCode.LINK_USED, DecisionCode.ALREADY_DECIDED)


async def test_a_decision_that_does_not_apply_consumes_no_link(harness: StoreHarness) -> None:
    store, effect = await _pending(harness)
    shown = effect_intent(effect, None)
    from datetime import UTC, datetime, timedelta

    approvals = approval_store(store)
    link = UsedLink("m" * 32, DecisionAction.APPROVE, datetime.now(UTC) + timedelta(hours=1))
    from agent_ledger.approvals import NewDecisionAttempt
    from agent_ledger.status import EffectStatus as S
    from agent_ledger.stores.approval_base import DecideRequest
    from agent_ledger.stores.base import Decision

    attempt = NewDecisionAttempt(
        effect.idem_key, "bob", Channel.LINK, DecisionAction.APPROVE, shown
    )
    stale = DecideRequest(
        effect.idem_key,
        S.READY,
        Decision(by="bob"),
        attempt,
        expected_attempt=effect.attempt + 1,
        link=link,
    )
    assert (await approvals.decide(stale)).effect is None
    fresh = DecideRequest(
        effect.idem_key,
        S.READY,
        Decision(by="bob"),
        attempt,
        expected_attempt=effect.attempt,
        link=link,
    )
    applied = await approvals.decide(fresh)
    assert applied.effect is not None and not applied.link_used
    again = await approvals.decide(fresh)
    assert again == (None, True)


async def test_separation_of_duty_refuses_the_requester(harness: StoreHarness) -> None:
    store, effect = await _pending(harness)
    await approval_store(store).renew_request(
        effect.idem_key, requested_by="agent-7", policy_version=None, deadline_ms=None
    )
    shown = effect_intent(effect, None)
    refused = await decide(
        store,
        effect.idem_key,
        action=DecisionAction.APPROVE,
        principal="agent-7",
        channel=Channel.CODE,
        shown_intent=shown,
        separation_of_duty=True,
    )
    assert not refused.accepted and refused.reason is DecisionCode.SELF_DECISION
    other = await decide(
        store,
        effect.idem_key,
        action=DecisionAction.APPROVE,
        principal="dana",
        channel=Channel.CODE,
        shown_intent=None,
        separation_of_duty=True,
    )
    assert other.accepted


async def test_past_its_deadline_an_approval_is_denied_as_expired(harness: StoreHarness) -> None:
    store, effect = await _pending(harness)
    approvals = approval_store(store)
    # run() recorded the request (no deadline); a new one replaces it.
    first = await approvals.renew_request(
        effect.idem_key, requested_by="w", policy_version=None, deadline_ms=0
    )
    again = await approvals.note_request(
        effect.idem_key, requested_by="x", policy_version="v9", deadline_ms=10**9
    )
    assert again == first, "the first request's deadline stands"
    await harness.age(10)
    denied = await expire_overdue(store)
    assert [e.idem_key for e in denied] == [effect.idem_key]
    final = await store.find(effect.idem_key)
    assert final is not None and final.status is EffectStatus.DENIED
    assert final.error is not None and final.error.code == ErrorCode.APPROVAL_EXPIRED
    late = await decide(
        store,
        effect.idem_key,
        action=DecisionAction.APPROVE,
        principal="alice",
        channel=Channel.CONSOLE,
        shown_intent=effect_intent(effect, first),
    )
    assert not late.accepted and late.reason is DecisionCode.ALREADY_DECIDED
    assert await expire_overdue(store) == []
