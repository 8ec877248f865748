"""A begin() worker may send the effect it holds to a person before running it, fenced
by its attempt; anyone else asking for a running effect gets an error, never a
silent False (issue 26, item 8: 0.2.x's worker flow ``begin()`` then
``request_approval(key)`` lost its approval gate, and the next ``run()`` took
the effect over and ran it with no approval)."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import (
    Effect,
    EffectLedgerValidationError,
    EffectStatus,
    LedgerHooks,
    RunOptions,
    ToolCall,
)
from agent_ledger.effects import CommitSucceeded
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness

REFUND = ToolCall(workflow_id="order-7", tool="refund", args={"cents": 90_000})
#: A caller that would take over a stale holder after 1 s, and waits 50 ms for a person.
IMPATIENT = RunOptions(
    stale=StaleOptions(after_ms=1_000), concurrency=ConcurrencyOptions(approval_timeout_ms=50)
)


async def test_begin_then_request_approval_keeps_the_gate(harness: StoreHarness) -> None:
    """0.2.x's worker flow, unchanged: the effect waits for a person, however long the
    holder stays away; after approve() the next call runs it once."""
    notified: list[str] = []
    ledger = build_ledger(
        harness.store, hooks=LedgerHooks(on_approval_required=lambda e: notified.append(e.id))
    )
    begun = await ledger.begin(REFUND, run_options=IMPATIENT)
    key = begun.effect.idem_key
    assert await ledger.request_approval(key) is True
    pending = await ledger.find_by_idem_key(key)
    assert pending is not None
    assert pending.status is EffectStatus.REQUIRES_APPROVAL
    assert pending.executions == 0  # the tool never ran
    assert notified == [begun.effect.id]

    await harness.age(60_000)  # far past any lease: no takeover of a gated effect
    ran: list[int] = []

    def refund(effect: Effect) -> str:
        ran.append(effect.attempt)
        return "refunded"

    with pytest.raises(EffectTimeoutError):
        await ledger.run(REFUND, refund, IMPATIENT)
    assert ran == []
    # The holder's late commit is fenced off: it gave the effect away.
    assert not await ledger.commit(
        begun.effect.id, CommitSucceeded(result="late"), attempt=begun.effect.attempt
    )
    assert await ledger.approve(key, by="ops")
    assert await ledger.run(REFUND, refund) == "refunded"
    assert await ledger.run(REFUND, refund) == "refunded"
    done = await ledger.find_by_idem_key(key)
    assert done is not None
    assert (done.status, done.executions, ran) == (EffectStatus.SUCCEEDED, 1, [2])


async def test_the_holder_names_its_attempt_from_another_ledger(harness: StoreHarness) -> None:
    """A worker whose begin() ran in another ledger object (another process) passes
    ``attempt=`` and is recognised as the holder."""
    begun = await harness.ledger().begin(REFUND)
    other = harness.ledger()
    key = begun.effect.idem_key
    assert await other.request_approval(key, attempt=begun.effect.attempt) is True
    effect = await other.find_by_idem_key(key)
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    # Asking again, already waiting: nothing to do.
    assert await other.request_approval(key, attempt=begun.effect.attempt) is False


async def test_anyone_else_gets_a_clear_error_and_nothing_changes(
    harness: StoreHarness,
) -> None:
    begun = await harness.ledger().begin(REFUND)
    key = begun.effect.idem_key
    before = await harness.store.find(key)
    stranger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError, match="held by another caller") as info:
        await stranger.request_approval(key)
    assert info.value.field == "idem_key"
    assert "attempt=result.effect.attempt" in str(info.value)
    assert await harness.store.find(key) == before


async def test_a_holder_that_was_taken_over_is_told_so(harness: StoreHarness) -> None:
    """Fenced: the first holder went silent, a second caller took the effect over; the
    first one's request changes nothing and says it no longer holds the effect."""
    first = harness.ledger()
    begun = await first.begin(REFUND, run_options=IMPATIENT)
    await harness.age(60_000)
    second = await harness.ledger().begin(REFUND, run_options=IMPATIENT)
    assert second.effect.attempt == begun.effect.attempt + 1
    key = begun.effect.idem_key
    with pytest.raises(EffectLedgerValidationError, match="no longer holds") as info:
        await first.request_approval(key)
    assert info.value.field == "attempt"
    still = await harness.store.find(key)
    assert still is not None
    assert (still.status, still.attempt) == (EffectStatus.PROCESSING, second.effect.attempt)


async def test_a_committed_effect_is_no_longer_the_callers(harness: StoreHarness) -> None:
    """After its commit, the begin() caller holds nothing: a finished effect returns False."""
    ledger = harness.ledger()
    begun = await ledger.begin(REFUND)
    assert await ledger.commit(begun.effect.id, CommitSucceeded(result="done"))
    assert await ledger.request_approval(begun.effect.idem_key) is False


@pytest.mark.parametrize("attempt", [0, -1, "1", 1.0, True])
async def test_a_bad_attempt_is_refused(harness: StoreHarness, attempt: object) -> None:
    ledger = harness.ledger()
    begun = await ledger.begin(REFUND)
    with pytest.raises(EffectLedgerValidationError) as info:
        await ledger.request_approval(begun.effect.idem_key, attempt=attempt)  # type: ignore[arg-type]
    assert info.value.field == "attempt"
    still = await harness.store.find(begun.effect.idem_key)
    assert still is not None and still.status is EffectStatus.PROCESSING


async def test_another_task_on_the_same_ledger_is_not_the_holder(harness: StoreHarness) -> None:
    """ "The caller whose begin() created it" is the task that called begin(): a reviewer
    task sharing the ledger object is anyone else. Parking a running effect from there
    would refuse the worker's commit and have the tool run again after the approval."""
    ledger = build_ledger(harness.store)
    begun = await ledger.begin(REFUND)
    key = begun.effect.idem_key
    charges = ["worker"]  # the holder ran the side effect

    async def reviewer() -> bool:
        return await ledger.request_approval(key)

    with pytest.raises(EffectLedgerValidationError) as refused:
        await asyncio.create_task(reviewer())
    assert refused.value.field == "idem_key"
    still = await ledger.find_by_idem_key(key)
    assert still is not None and still.status is EffectStatus.PROCESSING
    assert await ledger.commit(
        begun.effect.id, CommitSucceeded(result="refunded"), attempt=begun.effect.attempt
    )

    def refund(effect: Effect) -> str:
        charges.append("again")
        return "refunded twice"

    assert await ledger.run(REFUND, refund) == "refunded"
    assert charges == ["worker"]
