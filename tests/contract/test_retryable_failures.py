"""Failures the tool declares retryable: the next call runs the handler again, once,
on every store (``Store.retry_failed``, the fenced ``failed -> processing`` edge)."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import (
    Effect,
    EffectFailedError,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    MemoryStore,
    RetryableToolError,
    RunOptions,
    ToolCall,
)
from agent_ledger.effects import CommitFailed, EffectError, RetryableFailure
from agent_ledger.receipt import render_receipt
from tests.harness import StoreHarness

S = EffectStatus
CALL = ToolCall(workflow_id="wf", tool="mail.send", args={"to": "ada"})
RETRY_CONNECTION = RunOptions(retryable=(ConnectionError,))


async def stored(harness: StoreHarness, key: str) -> Effect:
    effect = await harness.store.find(key)
    assert effect is not None
    return effect


async def test_a_retryable_failure_runs_again_on_the_next_call(harness: StoreHarness) -> None:
    """First call fails retryably (recorded, marked on the receipt); the next call runs
    the handler as attempt 2 and its success is the receipt; later calls replay it."""
    ledger = harness.ledger()
    key = ledger.idem_key(CALL)
    runs: list[int] = []

    def flaky(effect: Effect) -> str:
        runs.append(effect.attempt)
        if effect.attempt == 1:
            raise ConnectionError("smtp down")
        return "sent"

    with pytest.raises(ConnectionError) as first:
        await ledger.run(CALL, flaky, RETRY_CONNECTION)
    assert any("retryable" in note for note in first.value.__notes__)
    failed = await stored(harness, key)
    assert failed.status is S.FAILED and failed.retryable
    assert failed.error == EffectError("smtp down", "ConnectionError")
    last = failed.history[-1]
    assert isinstance(last, RetryableFailure)
    assert (last.attempt, last.message, last.code) == (1, "smtp down", "ConnectionError")
    assert last.at == failed.completed_at or abs((last.at - failed.updated_at).total_seconds()) < 1
    assert "retryable" in render_receipt(failed)

    assert await ledger.run(CALL, flaky, RETRY_CONNECTION) == "sent"
    assert await ledger.run(CALL, flaky, RETRY_CONNECTION) == "sent"
    assert runs == [1, 2]
    done = await stored(harness, key)
    assert (done.status, done.attempt, done.executions, done.error) == (S.SUCCEEDED, 2, 2, None)
    assert not done.retryable
    # The earlier failure stays in the history.
    assert any(isinstance(e, RetryableFailure) and e.attempt == 1 for e in done.history)


async def test_a_failure_stays_final_by_default(harness: StoreHarness) -> None:
    """Without retryable=, a failure is the receipt: repeats replay it, with the remedy."""
    ledger = harness.ledger()
    runs = 0

    def broken(effect: Effect) -> str:
        nonlocal runs
        runs += 1
        raise ConnectionError("smtp down")

    with pytest.raises(ConnectionError):
        await ledger.run(CALL, broken)
    with pytest.raises(EffectFailedError) as replay:
        await ledger.run(CALL, broken)
    assert runs == 1
    assert not replay.value.retryable
    assert "agent-ledger retry" in str(replay.value)
    failed = await stored(harness, ledger.idem_key(CALL))
    assert not failed.retryable
    assert not any(isinstance(e, RetryableFailure) for e in failed.history)


async def test_an_undeclared_exception_stays_final(harness: StoreHarness) -> None:
    """retryable=(ConnectionError,) does not make a ValueError retryable."""
    ledger = harness.ledger()

    def broken(effect: Effect) -> str:
        raise ValueError("bad address")

    with pytest.raises(ValueError, match="bad address"):
        await ledger.run(CALL, broken, RETRY_CONNECTION)
    with pytest.raises(EffectFailedError):
        await ledger.run(CALL, broken, RETRY_CONNECTION)
    assert not (await stored(harness, ledger.idem_key(CALL))).retryable


async def test_retryable_tool_error_and_a_predicate(harness: StoreHarness) -> None:
    """RetryableToolError is always retryable; a predicate decides for other exceptions."""
    ledger = harness.ledger()
    other = ToolCall(workflow_id="wf", tool="mail.send", args={"to": "bob"})
    attempts: list[int] = []

    def asks_again(effect: Effect) -> str:
        attempts.append(effect.attempt)
        if effect.attempt == 1:
            raise RetryableToolError("say which Ada", code="ambiguous_recipient")
        return "ok"

    with pytest.raises(RetryableToolError):
        await ledger.run(CALL, asks_again)
    failed = await stored(harness, ledger.idem_key(CALL))
    assert failed.retryable and failed.error == EffectError("say which Ada", "ambiguous_recipient")
    assert await ledger.run(CALL, asks_again) == "ok"

    by_predicate = RunOptions(retryable=lambda exc: "try later" in str(exc))

    def busy(effect: Effect) -> str:
        if effect.attempt == 1:
            raise RuntimeError("busy, try later")
        return "ok"

    with pytest.raises(RuntimeError):
        await ledger.run(other, busy, by_predicate)
    assert await ledger.run(other, busy, by_predicate) == "ok"


async def test_the_fence_lets_exactly_one_retry_win(harness: StoreHarness) -> None:
    """Two retries of the same failed attempt: one claims attempt 2, the other changes nothing."""
    ledger = harness.ledger()
    effect = (await ledger.begin(CALL)).effect
    await ledger.commit(
        effect.id, CommitFailed(EffectError("down", "E"), retryable=True), attempt=effect.attempt
    )
    failed = await stored(harness, effect.idem_key)
    assert failed.retryable
    first = await harness.store.retry_failed(failed.idem_key, attempt=1, lease_ms=5_000)
    second = await harness.store.retry_failed(failed.idem_key, attempt=1, lease_ms=5_000)
    assert first.claimed and not second.claimed
    assert first.effect is not None and second.effect is not None
    claimed = first.effect
    assert (claimed.status, claimed.attempt, claimed.executions) == (S.PROCESSING, 2, 2)
    assert (claimed.error, claimed.result, claimed.completed_at, claimed.tries) == (
        None,
        None,
        None,
        0,
    )
    assert claimed.lease_ms == 5_000
    assert second.effect.status is S.PROCESSING and second.effect.attempt == 2
    # The failure stays in the history; the effect is no longer "retryable".
    assert any(isinstance(e, RetryableFailure) for e in claimed.history)
    assert not claimed.retryable
    unknown = await harness.store.retry_failed("0" * 64, attempt=1, lease_ms=5_000)
    assert unknown == (None, False)


async def test_retry_failed_needs_the_failed_attempt(harness: StoreHarness) -> None:
    """A stale attempt, or an effect that is not failed, is never retried."""
    ledger = harness.ledger()
    effect = (await ledger.begin(CALL)).effect
    running = await harness.store.retry_failed(effect.idem_key, attempt=1, lease_ms=5_000)
    assert not running.claimed
    await ledger.commit(
        effect.id, CommitFailed(EffectError("down"), retryable=True), attempt=effect.attempt
    )
    before = await stored(harness, effect.idem_key)
    stale = await harness.store.retry_failed(effect.idem_key, attempt=7, lease_ms=5_000)
    assert not stale.claimed
    assert await stored(harness, effect.idem_key) == before


async def test_concurrent_callers_after_a_retryable_failure_run_it_once(
    harness: StoreHarness,
) -> None:
    """N tasks call after a retryable failure: the handler runs exactly once more, and
    every task gets that run's outcome."""
    ledger = harness.ledger()
    runs: list[int] = []
    gate = asyncio.Event()

    async def flaky(effect: Effect) -> str:
        runs.append(effect.attempt)
        if effect.attempt == 1:
            raise ConnectionError("down")
        await gate.wait()
        return f"sent on attempt {effect.attempt}"

    with pytest.raises(ConnectionError):
        await ledger.run(CALL, flaky, RETRY_CONNECTION)
    callers = [asyncio.create_task(ledger.run(CALL, flaky, RETRY_CONNECTION)) for _ in range(8)]
    await asyncio.sleep(0.2)
    gate.set()
    results = await asyncio.gather(*callers)
    assert runs == [1, 2]
    assert results == ["sent on attempt 2"] * 8


async def test_waiters_on_a_retry_that_fails_again_get_that_failure(
    harness: StoreHarness,
) -> None:
    """Callers that joined a retry get its outcome, even a new retryable failure: one
    call of theirs is one run; the next call after it runs again."""
    ledger = harness.ledger()
    runs: list[int] = []
    gate = asyncio.Event()

    async def down(effect: Effect) -> str:
        runs.append(effect.attempt)
        if effect.attempt == 2:
            await gate.wait()
        if effect.attempt < 3:
            raise ConnectionError(f"down on {effect.attempt}")
        return "sent"

    with pytest.raises(ConnectionError):
        await ledger.run(CALL, down, RETRY_CONNECTION)
    callers = [asyncio.create_task(ledger.run(CALL, down, RETRY_CONNECTION)) for _ in range(4)]
    await asyncio.sleep(0.2)
    gate.set()
    outcomes = await asyncio.gather(*callers, return_exceptions=True)
    assert runs == [1, 2]
    assert all(isinstance(o, ConnectionError | EffectFailedError) for o in outcomes)
    replays = [o for o in outcomes if isinstance(o, EffectFailedError)]
    assert len(replays) == 3 and all(r.retryable and "down on 2" in r.message for r in replays)
    assert await ledger.run(CALL, down, RETRY_CONNECTION) == "sent"
    assert runs == [1, 2, 3]


async def test_a_replay_serves_the_recorded_outcome(harness: StoreHarness) -> None:
    """ledger.replay() answers from the recording: the handler never runs again there."""
    ledger = harness.ledger()

    def flaky(effect: Effect) -> str:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await ledger.run(CALL, flaky, RETRY_CONNECTION)

    def must_not_run(effect: Effect) -> str:
        raise AssertionError("replay ran the handler")

    replayer = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    async with replayer.replay("wf", source=harness.store):
        with pytest.raises(EffectFailedError) as replayed:
            await replayer.run(CALL, must_not_run, RETRY_CONNECTION)
    assert replayed.value.retryable
    assert (await stored(harness, ledger.idem_key(CALL))).attempt == 1
