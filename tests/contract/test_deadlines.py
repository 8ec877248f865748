"""Handler deadlines (``RunOptions(timeout_ms=...)``), on every store.

The deadline cancels an async handler; a plain one cannot be interrupted, so
its breach is recorded when it returns. Either way the effect ends with the
code ``handler_timeout``, is never run again automatically (not by a retry
policy either), and every caller, first or replaying, gets
``HandlerTimeoutError``, a kind of ``EffectTimeoutError`` that names the
handler, not a wait.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_ledger import Effect, EffectDeniedError, EffectStatus, RetryPolicy, RunOptions, ToolCall
from agent_ledger.backoff import MAX_MS
from agent_ledger.clock import ManualClock
from agent_ledger.effects import CommitSucceeded, TryFailure
from agent_ledger.errors import EffectTimeoutError, HandlerTimeoutError
from agent_ledger.options import MAX_LEASE_MS, ConcurrencyOptions, StaleOptions
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="slow.tool", args={"n": 1})
#: Far longer than any deadline here: a handler that sleeps this long was not stopped.
FOREVER_S = 60.0


async def stored(harness: StoreHarness) -> Effect:
    effect = await harness.store.find(harness.ledger().idem_key(CALL))
    assert effect is not None
    return effect


async def test_an_async_handler_is_cancelled_at_its_deadline(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    cancelled = asyncio.Event()

    async def slow(effect: Effect) -> str:
        try:
            await asyncio.sleep(FOREVER_S)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    began = time.monotonic()
    with pytest.raises(HandlerTimeoutError) as info:
        await ledger.run(CALL, slow, RunOptions(timeout_ms=100))
    assert time.monotonic() - began < FOREVER_S / 4
    assert cancelled.is_set()
    error = info.value
    # A timeout like any other to code that catches EffectTimeoutError, but worded
    # for the handler: it ran out of time, not a wait.
    assert isinstance(error, EffectTimeoutError)
    assert "handler" in str(error) and "ran out of time" in str(error)
    assert "waiting" not in str(error)
    assert error.limit_ms == 100 and error.ran_ms >= 100
    effect = await stored(harness)
    assert effect.status is EffectStatus.CANCELED
    assert effect.error is not None and effect.error.code == "handler_timeout"
    assert "timeout_ms=100" in effect.error.message
    assert "unknown" in effect.error.message  # its side effect may or may not have happened
    assert effect.result is None and effect.executions == 1 and effect.tries == 1
    assert error.effect.status is EffectStatus.CANCELED


async def test_a_replay_raises_the_same_error_and_runs_nothing(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    async def slow(effect: Effect) -> None:
        await asyncio.sleep(FOREVER_S)

    with pytest.raises(HandlerTimeoutError) as first:
        await ledger.run(CALL, slow, RunOptions(timeout_ms=50))
    runs = 0

    def fast(effect: Effect) -> str:
        nonlocal runs
        runs += 1
        return "ok"

    # Without a deadline, and from another ledger on the same store: the record decides.
    other = harness.ledger()
    with pytest.raises(HandlerTimeoutError) as again:
        await other.run(CALL, fast)
    assert runs == 0
    assert str(again.value) == str(first.value)
    assert (again.value.limit_ms, again.value.ran_ms) == (first.value.limit_ms, first.value.ran_ms)
    assert again.value.status is EffectStatus.CANCELED


async def test_a_handler_that_finishes_in_time_is_untouched(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    async def quick(effect: Effect) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"n": 1}

    assert await ledger.run(CALL, quick, RunOptions(timeout_ms=10_000)) == {"n": 1}
    effect = await stored(harness)
    assert effect.status is EffectStatus.SUCCEEDED and effect.error is None


async def test_its_own_timeout_error_before_the_deadline_is_an_ordinary_failure(
    harness: StoreHarness,
) -> None:
    """A TimeoutError the handler raises itself is retried like any error its policy names;
    only the deadline's own expiry is a handler timeout."""
    clock = ManualClock()
    ledger = build_ledger(harness.store, clock=clock)
    tries = 0

    async def flaky(effect: Effect) -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise TimeoutError("the API timed out")
        return "ok"

    options = RunOptions(timeout_ms=10_000, retry=RetryPolicy(on=TimeoutError, attempts=3))
    assert await ledger.run(CALL, flaky, options) == "ok"
    assert tries == 2


async def test_a_retry_policy_never_retries_a_timed_out_try(harness: StoreHarness) -> None:
    """Even a policy that retries TimeoutError (which asyncio's deadline raises) runs
    a timed-out handler once: its side effect may have happened."""
    clock = ManualClock()
    ledger = build_ledger(harness.store, clock=clock)
    tries = 0

    async def slow(effect: Effect) -> None:
        nonlocal tries
        tries += 1
        await asyncio.sleep(FOREVER_S)

    options = RunOptions(timeout_ms=50, retry=RetryPolicy(on=TimeoutError, attempts=5))
    with pytest.raises(HandlerTimeoutError):
        await ledger.run(CALL, slow, options)
    assert tries == 1 and clock.slept == []
    effect = await stored(harness)
    assert effect.status is EffectStatus.CANCELED
    assert effect.error is not None and effect.error.code == "handler_timeout"


async def test_the_deadline_applies_to_each_try(harness: StoreHarness) -> None:
    """A later try that runs past the deadline ends the run there, after the earlier
    tries' failures were recorded."""
    clock = ManualClock()
    ledger = build_ledger(harness.store, clock=clock)
    tries = 0

    async def flaky_then_slow(effect: Effect) -> None:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise ConnectionError("reset")
        await asyncio.sleep(FOREVER_S)

    options = RunOptions(timeout_ms=100, retry=RetryPolicy(on=ConnectionError, attempts=3))
    with pytest.raises(HandlerTimeoutError):
        await ledger.run(CALL, flaky_then_slow, options)
    assert tries == 2
    effect = await stored(harness)
    assert effect.status is EffectStatus.CANCELED
    assert effect.error is not None and effect.error.code == "handler_timeout"
    assert [(type(e).__name__, e.code) for e in effect.history if isinstance(e, TryFailure)] == [
        ("TryFailure", "ConnectionError")
    ]
    assert len(effect.history) == 1


@pytest.mark.parametrize("where", ["thread", "loop"])
async def test_a_plain_handler_is_waited_for_and_its_late_result_is_not_a_success(
    harness: StoreHarness, where: str
) -> None:
    """A plain function cannot be interrupted: the run waits for it, then records the
    breach as failed, keeping the late result visible but never returning it."""
    ledger = harness.ledger()

    def blocking(effect: Effect) -> dict[str, str]:
        time.sleep(0.4)
        return {"charge": "ch_1"}

    began = time.monotonic()
    options = RunOptions(timeout_ms=50, sync_handlers=where)  # type: ignore[arg-type]
    with pytest.raises(HandlerTimeoutError) as info:
        await ledger.run(CALL, blocking, options)
    assert time.monotonic() - began >= 0.4  # it returned only once the handler had
    effect = await stored(harness)
    assert effect.status is EffectStatus.FAILED
    assert effect.error is not None and effect.error.code == "handler_timeout"
    assert "cannot be interrupted" in effect.error.message
    assert effect.result == {"charge": "ch_1"}  # for a person to see
    assert info.value.ran_ms >= 400 and info.value.limit_ms == 50
    with pytest.raises(HandlerTimeoutError):  # a replay never hands the late result out
        await ledger.run(CALL, blocking)


async def test_a_plain_handler_raising_after_its_deadline(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    def blocking(effect: Effect) -> None:
        time.sleep(0.3)
        raise ValueError("card declined")

    with pytest.raises(HandlerTimeoutError) as info:
        await ledger.run(CALL, blocking, RunOptions(timeout_ms=50))
    assert isinstance(info.value.__cause__, ValueError)
    effect = await stored(harness)
    assert effect.status is EffectStatus.FAILED and effect.result is None
    assert effect.error is not None and effect.error.code == "handler_timeout"
    assert "ValueError: card declined" in effect.error.message


async def test_a_handler_ignoring_cancellation_keeps_the_effect_held(
    harness: StoreHarness,
) -> None:
    """It keeps running after its deadline's cancellation: heartbeats go on, nobody takes
    the effect over (its lease is shorter than the wait), and every caller then gets the
    handler timeout."""
    # 900 ms: between two beats (300 ms apart) the loop below ages the row by
    # 600 ms at most, leaving 300 ms for a beat delayed by a busy host (600 ms
    # left 200 ms, and a full fast-tier run once saw the effect taken over; 300
    # ms left 100 ms). The loop still ages it 2 s, over twice the lease.
    lease = StaleOptions(after_ms=900)
    ledger = harness.ledger(RunOptions(stale=lease))
    ignoring = asyncio.Event()
    finish = asyncio.Event()

    async def stubborn(effect: Effect) -> None:
        try:
            await asyncio.sleep(FOREVER_S)
        except asyncio.CancelledError:
            ignoring.set()
            await finish.wait()  # cleanup that takes a while
            raise

    first = asyncio.create_task(ledger.run(CALL, stubborn, RunOptions(timeout_ms=50)))
    await ignoring.wait()
    before = await stored(harness)
    runs = 0

    def second_handler(effect: Effect) -> str:
        nonlocal runs
        runs += 1
        return "ran twice"

    waiting = harness.ledger(RunOptions(stale=lease, concurrency=ConcurrencyOptions()))
    second = asyncio.create_task(waiting.run(CALL, second_handler))
    for _ in range(20):  # 1 s or more, past the lease, by every store's clock (manual or real)
        await harness.age(50)
        await asyncio.sleep(0.05)
    during = await stored(harness)
    assert during.status is EffectStatus.PROCESSING and during.attempt == before.attempt
    assert during.heartbeat_at > before.heartbeat_at
    assert not first.done() and not second.done()
    finish.set()
    with pytest.raises(HandlerTimeoutError):
        await first
    with pytest.raises(HandlerTimeoutError):
        await second
    assert runs == 0
    effect = await stored(harness)
    assert effect.status is EffectStatus.CANCELED and effect.executions == 1
    assert effect.error is not None and effect.error.code == "handler_timeout"


async def test_a_handler_that_swallows_its_cancellation_and_returns(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()

    async def swallower(effect: Effect) -> str:
        try:
            await asyncio.sleep(FOREVER_S)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
        return "done anyway"

    with pytest.raises(HandlerTimeoutError):
        await ledger.run(CALL, swallower, RunOptions(timeout_ms=50))
    effect = await stored(harness)
    assert effect.status is EffectStatus.FAILED and effect.result == "done anyway"
    assert effect.error is not None and effect.error.code == "handler_timeout"
    assert "did not stop when cancelled" in effect.error.message


async def test_cancelling_the_caller_during_the_deadline_handling(
    harness: StoreHarness,
) -> None:
    """The caller's own cancellation wins: it propagates, and the effect is recorded
    as a cancelled run (never left processing)."""
    ledger = harness.ledger()
    ignoring = asyncio.Event()

    async def stubborn(effect: Effect) -> None:
        try:
            await asyncio.sleep(FOREVER_S)
        except asyncio.CancelledError:
            ignoring.set()
            await asyncio.sleep(FOREVER_S)  # cancelled again by the caller's cancel
            raise

    task = asyncio.create_task(ledger.run(CALL, stubborn, RunOptions(timeout_ms=50)))
    await ignoring.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    effect = await stored(harness)
    assert effect.status is EffectStatus.CANCELED
    assert effect.error is not None and effect.error.code == "cancelled"
    with pytest.raises(EffectDeniedError):
        await ledger.run(CALL, stubborn)


async def test_a_ledger_default_deadline_and_turning_it_off(harness: StoreHarness) -> None:
    ledger = harness.ledger(RunOptions(timeout_ms=50))

    async def slowish(effect: Effect) -> str:
        await asyncio.sleep(0.2)
        return "ok"

    # None set on the call turns off the ledger's deadline.
    assert await ledger.run(CALL, slowish, RunOptions(timeout_ms=None)) == "ok"
    other = ToolCall(workflow_id="wf", tool="slow.tool", args={"n": 2})
    with pytest.raises(HandlerTimeoutError):
        await ledger.run(other, slowish)


async def test_begin_and_commit_are_not_bound_by_a_deadline(harness: StoreHarness) -> None:
    """A begin()/commit() worker runs its side effect itself: the ledger cannot cancel
    it, so timeout_ms does not apply to it."""
    ledger = harness.ledger(RunOptions(timeout_ms=20))
    begun = await ledger.begin(CALL, run_options=RunOptions(timeout_ms=20))
    assert not begun.cached
    await asyncio.sleep(0.1)
    assert await ledger.commit(begun.effect.id, CommitSucceeded("ok"), attempt=begun.effect.attempt)
    effect = await stored(harness)
    assert effect.status is EffectStatus.SUCCEEDED and effect.result == "ok"


async def test_the_longest_times_options_accept_run_on_every_store(harness: StoreHarness) -> None:
    """``MAX_MS`` (and ``MAX_LEASE_MS`` for the lease) are held by every clock and store:
    a run with each of them at its bound runs its handler once and succeeds."""
    longest = RunOptions(
        timeout_ms=MAX_MS,
        concurrency=ConcurrencyOptions(
            wait_timeout_ms=MAX_MS, approval_timeout_ms=MAX_MS, max_interval_ms=MAX_MS
        ),
        stale=StaleOptions(after_ms=MAX_LEASE_MS),
        retry=RetryPolicy(on=OSError, initial_ms=MAX_MS, max_ms=MAX_MS, timeout_ms=MAX_MS),
    )
    ran: list[int] = []

    async def handler(effect: Effect) -> str:
        ran.append(effect.attempt)
        return "ok"

    assert await harness.ledger().run(CALL, handler, longest) == "ok"
    assert ran == [1]
    effect = await stored(harness)
    assert (effect.status, effect.lease_ms) == (EffectStatus.SUCCEEDED, MAX_LEASE_MS)
