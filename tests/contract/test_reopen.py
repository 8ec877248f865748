"""Reopen: a person sends a failed or canceled effect back to run once more, on every store."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import (
    Effect,
    EffectError,
    EffectFailedError,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
    RetryPolicy,
    RunOptions,
    ToolCall,
)
from agent_ledger.clock import ManualClock
from agent_ledger.effects import Reopening, TryFailure
from agent_ledger.receipt import render_receipt
from agent_ledger.testing import build_ledger
from tests.contract.test_transitions import put_in
from tests.harness import StoreHarness

S = EffectStatus
CALL = ToolCall(workflow_id="wf", tool="mail.send", args={"to": "ada"})


async def stored(ledger: EffectLedger, key: str) -> Effect:
    effect = await ledger.find_by_idem_key(key)
    assert effect is not None
    return effect


async def test_a_fixed_tool_runs_again_once_after_reopen(harness: StoreHarness) -> None:
    """The typo story: the stored NameError replays until someone reopens the effect;
    then the next call runs it once, and later calls replay the new outcome."""
    ledger = harness.ledger()
    key = ledger.idem_key(CALL)
    runs: list[int] = []

    def broken(effect: Effect) -> str:
        runs.append(effect.attempt)
        raise NameError("name 'recipent' is not defined")

    def fixed(effect: Effect) -> str:
        runs.append(effect.attempt)
        return "sent"

    with pytest.raises(NameError):
        await ledger.run(CALL, broken)
    with pytest.raises(EffectFailedError):
        await ledger.run(CALL, fixed)
    failed = await stored(ledger, key)
    assert await ledger.reopen(key, by="ada", reason="typo fixed in mail.send")
    ready = await stored(ledger, key)
    assert (ready.status, ready.error, ready.tries, ready.completed_at) == (S.READY, None, 0, None)
    assert (ready.attempt, ready.result) == (failed.attempt, None)
    (event,) = ready.history
    assert isinstance(event, Reopening)
    assert event == Reopening(
        status=S.FAILED,
        error=EffectError("name 'recipent' is not defined", "NameError"),
        tries=1,
        by="ada",
        reason="typo fixed in mail.send",
        at=event.at,
    )
    assert failed.completed_at is not None and event.at >= failed.completed_at
    assert (ready.decided_by, ready.decision_note, ready.decided_at) == (
        "ada",
        "typo fixed in mail.send",
        event.at,
    )
    assert "decision  reopened by ada: typo fixed in mail.send" in render_receipt(ready)
    assert await ledger.run(CALL, fixed) == "sent"
    assert await ledger.run(CALL, fixed) == "sent"
    assert runs == [1, 2], "once before, once after the reopen"
    done = await stored(ledger, key)
    assert (done.status, done.result, done.tries, done.executions) == (S.SUCCEEDED, "sent", 1, 2)
    assert done.history == ready.history, "the earlier failure stays on the receipt"


async def test_a_canceled_effect_is_reopened_too(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    key, _ = await put_in(ledger, S.CANCELED)
    canceled = await stored(ledger, key)
    assert await ledger.reopen(key, by="ops", reason="canceled by mistake")
    (event,) = (await stored(ledger, key)).history
    assert isinstance(event, Reopening) and event.status is S.CANCELED
    assert event.error == canceled.error
    assert (
        await ledger.run(ToolCall(workflow_id="wf", tool="deploy", args={"v": 2}), lambda e: 3) == 3
    )


async def test_a_retried_effect_counts_its_tries_afresh_and_keeps_the_old_ones(
    harness: StoreHarness,
) -> None:
    clock = ManualClock()
    ledger = build_ledger(harness.store, clock=clock)
    key = ledger.idem_key(CALL)
    policy = RunOptions(retry=RetryPolicy(on=ConnectionError, attempts=2, jitter=0))
    down = True

    async def handler(effect: Effect) -> str:
        if down:
            raise ConnectionError("smtp down")
        return "sent"

    with pytest.raises(ConnectionError):
        await ledger.run(CALL, handler, policy)
    assert (await stored(ledger, key)).tries == 2
    assert await ledger.reopen(key, by="ops", reason="smtp is back")
    down = False
    assert await ledger.run(CALL, handler, policy) == "sent"
    effect = await stored(ledger, key)
    assert effect.tries == 1
    kinds = [(type(e).__name__, getattr(e, "number", None)) for e in effect.history]
    assert kinds == [("TryFailure", 1), ("TryFailure", 2), ("Reopening", None)]
    reopening = effect.history[-1]
    assert isinstance(reopening, Reopening) and reopening.tries == 2
    assert reopening.error is not None and reopening.error.code == "retries_exhausted"
    assert all(isinstance(e, TryFailure) for e in effect.history[:2])


@pytest.mark.parametrize(
    ("status", "why"),
    [(S.SUCCEEDED, "its result is the receipt"), (S.DENIED, "a denial stands")],
)
async def test_a_success_or_a_denial_is_never_reopened(
    harness: StoreHarness, status: S, why: str
) -> None:
    ledger = harness.ledger()
    key, _ = await put_in(ledger, status)
    before = await stored(ledger, key)
    with pytest.raises(EffectLedgerValidationError, match=why) as refused:
        await ledger.reopen(key, by="ops", reason="again")
    assert refused.value.field == "idem_key"
    assert "new call" in str(refused.value)
    assert await stored(ledger, key) == before
    assert await harness.store.reopen(key, by="ops", reason="again") is None


@pytest.mark.parametrize("status", [S.PROCESSING, S.READY, S.REQUIRES_APPROVAL])
async def test_an_unfinished_effect_is_not_reopened(harness: StoreHarness, status: S) -> None:
    ledger = harness.ledger()
    key, _ = await put_in(ledger, status)
    before = await stored(ledger, key)
    assert not await ledger.reopen(key, by="ops", reason="again")
    assert await stored(ledger, key) == before


async def test_an_unknown_key_is_not_reopened(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    assert not await ledger.reopen("f" * 64, by="ops", reason="again")
    assert await harness.raw_count() == 0


@pytest.mark.parametrize(
    ("by", "reason", "field"),
    [
        ("", "why", "by"),
        ("   ", "why", "by"),
        (None, "why", "by"),
        ("ops", "", "reason"),
        ("ops", 3, "reason"),
    ],
)
async def test_who_and_why_are_required(
    harness: StoreHarness, by: object, reason: object, field: str
) -> None:
    ledger = harness.ledger()
    key, _ = await put_in(ledger, S.FAILED)
    before = await stored(ledger, key)
    with pytest.raises(EffectLedgerValidationError) as info:
        await ledger.reopen(key, by=by, reason=reason)  # type: ignore[arg-type]
    assert info.value.field == field
    assert await stored(ledger, key) == before


async def test_two_people_reopening_at_once_one_wins(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    key, _ = await put_in(ledger, S.FAILED)
    moved = await asyncio.gather(
        *(ledger.reopen(key, by=f"op{n}", reason="again") for n in range(4))
    )
    assert sorted(moved) == [False, False, False, True]
    assert len((await stored(ledger, key)).history) == 1


async def test_a_handler_still_running_after_a_cancel_stays_fenced_off(
    harness: StoreHarness,
) -> None:
    """Cancel while the handler runs, reopen, and a new call runs it: the old
    handler's late commit is refused (its attempt is behind), and the new outcome
    stands."""
    ledger = harness.ledger()
    key = ledger.idem_key(CALL)
    started, finish = asyncio.Event(), asyncio.Event()

    async def slow(effect: Effect) -> str:
        started.set()
        await finish.wait()
        return f"old {effect.attempt}"

    old = asyncio.create_task(ledger.run(CALL, slow))
    await started.wait()
    assert await ledger.cancel(key, reason="stuck", by="ops")
    assert await ledger.reopen(key, by="ops", reason="run it again")
    assert (
        await harness.store.commit(
            (await stored(ledger, key)).id,
            attempt=1,
            status=S.SUCCEEDED,
            result_json='"late"',
            error=None,
        )
        is False
    ), "the old attempt's commit is fenced off while the effect is ready"
    assert await ledger.run(CALL, lambda e: f"new {e.attempt}") == "new 2"
    finish.set()
    assert await asyncio.wait_for(old, 30) == "new 2", "the old run gets the new outcome"
    effect = await stored(ledger, key)
    assert (effect.status, effect.result, effect.attempt) == (S.SUCCEEDED, "new 2", 2)
    (event,) = effect.history
    assert isinstance(event, Reopening) and event.status is S.CANCELED
