"""Retries: every try inside one claim, each failure recorded durably, on every store.

The ledger waits between tries with a ``ManualClock``'s sleep, so nothing
here sleeps for real: ``clock.slept`` lists every delay the ledger asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agent_ledger import (
    Effect,
    EffectDeniedError,
    EffectError,
    EffectFailedError,
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    EffectStatus,
    RetryPolicy,
    RunOptions,
    ToolCall,
)
from agent_ledger.clock import ManualClock
from agent_ledger.effects import TryFailure
from agent_ledger.retries import NonRetryableError
from agent_ledger.testing import FaultyStore, When, build_ledger
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="psp.charge", args={"order": "o42"})
#: Delays of 100 ms, then 200, 400, ... each within ±50 %.
POLICY = RetryPolicy(on=ConnectionError, attempts=5, initial_ms=100, max_ms=1_000, jitter=0.5)


class RateLimited(Exception):
    """A downstream API's 429, asking to be called again after ``retry_after_s``."""

    def __init__(self, retry_after_s: object) -> None:
        super().__init__("slow down")
        self.retry_after_s = retry_after_s


class Declined(Exception):
    """A card declined: trying again changes nothing."""

    non_retryable = True


def timed(harness: StoreHarness) -> tuple[EffectLedger, ManualClock]:
    clock = ManualClock()
    return build_ledger(harness.store, clock=clock), clock


def failing(
    *errors: BaseException, then: object = "ok"
) -> tuple[Callable[[Effect], object], list[Effect]]:
    """A handler raising ``errors`` one per call, then returning ``then``; and its calls."""
    calls: list[Effect] = []

    async def handler(effect: Effect) -> object:
        calls.append(effect)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return then

    return handler, calls


def down(n: int) -> EffectError:
    """The error of failed try ``n``, recorded by hand as the ledger would."""
    return EffectError(f"down {n}", "ConnectionError")


async def stored(ledger: EffectLedger) -> Effect:
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None
    return effect


def failures(effect: Effect) -> list[TryFailure]:
    return [e for e in effect.history if isinstance(e, TryFailure)]


async def test_two_retryable_errors_then_success(harness: StoreHarness) -> None:
    """tries=3, one receipt, both errors kept, each delay within backoff and jitter."""
    ledger, clock = timed(harness)
    handler, calls = failing(ConnectionError("reset"), ConnectionError("refused"), then={"id": 7})
    result = await ledger.run(CALL, handler, RunOptions(retry=POLICY))
    assert result == {"id": 7}
    assert len(calls) == 3
    assert [c.tries for c in calls] == [0, 1, 2], "each try sees how many came before"
    effect = await stored(ledger)
    assert (effect.status, effect.tries, effect.result) == (EffectStatus.SUCCEEDED, 3, {"id": 7})
    assert (effect.attempt, effect.executions) == (1, 1), "all tries inside one claim"
    assert await harness.raw_count() == 1
    tried = failures(effect)
    assert [(t.number, t.attempt, t.message, t.code, t.type) for t in tried] == [
        (1, 1, "reset", "ConnectionError", "ConnectionError"),
        (2, 1, "refused", "ConnectionError", "ConnectionError"),
    ]
    assert tried[0].at <= tried[1].at
    assert len(clock.slept) == 2
    for step, delay in enumerate(clock.slept):
        base = 0.1 * 2**step
        assert base * 0.5 <= delay <= base * 1.5, (step, delay)
    assert await ledger.run(CALL, handler, RunOptions(retry=POLICY)) == {"id": 7}
    assert len(calls) == 3, "a replay runs nothing"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ValueError("bad amount"), id="not-in-on"),
        pytest.param(NonRetryableError("card blocked"), id="NonRetryableError"),
        pytest.param(Declined("declined"), id="non_retryable-attribute"),
        pytest.param(EffectLedgerValidationError("bad input"), id="ledger-validation-error"),
    ],
)
async def test_a_non_retryable_error_gets_exactly_one_try(
    harness: StoreHarness, error: Exception
) -> None:
    ledger, clock = timed(harness)
    handler, calls = failing(error, error)
    # Naming the opt-outs in `on` does not make them retryable; ValueError is not named.
    opted_out = (NonRetryableError, Declined, EffectLedgerValidationError)
    policy = RetryPolicy(on=(ConnectionError, *opted_out), attempts=5)
    with pytest.raises(type(error)):
        await ledger.run(CALL, handler, RunOptions(retry=policy))
    assert len(calls) == 1 and clock.slept == []
    effect = await stored(ledger)
    assert (effect.status, effect.tries, effect.history) == (EffectStatus.FAILED, 1, ())
    assert effect.error is not None and effect.error.code == type(error).__name__


async def test_a_non_json_result_is_not_retried(harness: StoreHarness) -> None:
    """A result that cannot be stored fails the same way every time: one try."""
    ledger, clock = timed(harness)
    handler, calls = failing(then={1, 2})
    policy = RetryPolicy(on=Exception, attempts=5)
    with pytest.raises(EffectLedgerValidationError):
        await ledger.run(CALL, handler, RunOptions(retry=policy))
    assert len(calls) == 1 and clock.slept == []
    effect = await stored(ledger)
    assert effect.error is not None and effect.error.code == "result_not_serializable"


async def test_cancellation_is_never_retried(harness: StoreHarness) -> None:
    """A handler raising CancelledError (as a cancelled await inside it does) ends the run."""
    ledger, clock = timed(harness)
    handler, calls = failing(asyncio.CancelledError(), ConnectionError("x"))
    with pytest.raises(asyncio.CancelledError):
        await ledger.run(CALL, handler, RunOptions(retry=POLICY))
    assert len(calls) == 1 and clock.slept == []
    effect = await stored(ledger)
    assert (effect.status, effect.tries) == (EffectStatus.CANCELED, 1)
    assert effect.error is not None and effect.error.code == "cancelled"


async def test_cancelled_while_waiting_to_retry(harness: StoreHarness) -> None:
    """A cancellation during the wait is recorded like a cancelled run: canceled, with
    the tries so far kept, and no further try."""
    waiting = asyncio.Event()

    async def never_wakes(seconds: float) -> None:
        waiting.set()
        await asyncio.Event().wait()

    # A wait long enough to cancel in.
    ledger = EffectLedger(EffectLedgerOptions(store=harness.store, sleep=never_wakes))
    handler, calls = failing(ConnectionError("reset"))
    task = asyncio.create_task(ledger.run(CALL, handler, RunOptions(retry=POLICY)))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 1
    effect = await stored(ledger)
    assert (effect.status, effect.tries, len(failures(effect))) == (EffectStatus.CANCELED, 1, 1)
    assert effect.error is not None and effect.error.code == "cancelled"
    assert "waited to retry after try 1" in effect.error.message


async def test_when_the_tries_run_out(harness: StoreHarness) -> None:
    """The original exception is raised, the receipt says retries_exhausted, nothing
    waits after the last try, and a replay raises EffectFailedError."""
    ledger, clock = timed(harness)
    policy = RetryPolicy(on=ConnectionError, attempts=3, initial_ms=10, jitter=0)
    handler, calls = failing(*(ConnectionError(f"down {n}") for n in range(1, 10)))
    with pytest.raises(ConnectionError, match="down 3") as raised:
        await ledger.run(CALL, handler, RunOptions(retry=policy))
    assert raised.value.__context__ is None, "not chained to the earlier tries' errors"
    assert len(calls) == 3
    assert clock.slept == [0.01, 0.02], "no sleep after the last try"
    effect = await stored(ledger)
    assert (effect.status, effect.tries) == (EffectStatus.FAILED, 3)
    assert effect.error is not None and effect.error.code == "retries_exhausted"
    assert "3 tries" in effect.error.message and "down 3" in effect.error.message
    assert [t.message for t in failures(effect)] == ["down 1", "down 2", "down 3"]
    with pytest.raises(EffectFailedError) as replay:
        await ledger.run(CALL, handler, RunOptions(retry=policy))
    assert replay.value.code == "retries_exhausted"
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("asked", "slept"),
    [
        pytest.param(120, 1.0, id="clamped-to-max_ms"),
        pytest.param(0.25, 0.25, id="used-as-given"),
        pytest.param(-1, None, id="negative-ignored"),
        pytest.param("soon", None, id="not-a-number-ignored"),
    ],
)
async def test_an_exception_may_ask_for_its_delay(
    harness: StoreHarness, asked: object, slept: float | None
) -> None:
    ledger, clock = timed(harness)
    policy = RetryPolicy(on=RateLimited, attempts=2, initial_ms=50, max_ms=1_000, jitter=0)
    handler, _ = failing(RateLimited(asked))
    assert await ledger.run(CALL, handler, RunOptions(retry=policy)) == "ok"
    assert clock.slept == [0.05 if slept is None else slept]


async def test_no_try_starts_past_the_time_budget(harness: StoreHarness) -> None:
    """timeout_ms: try 3 would start 300 ms after the first, past 250 ms."""
    ledger, clock = timed(harness)
    policy = RetryPolicy(on=ConnectionError, attempts=5, initial_ms=100, jitter=0, timeout_ms=250)
    handler, calls = failing(*(ConnectionError("down") for _ in range(5)))
    with pytest.raises(ConnectionError):
        await ledger.run(CALL, handler, RunOptions(retry=policy))
    assert len(calls) == 2 and clock.slept == [0.1]
    effect = await stored(ledger)
    assert effect.error is not None and effect.error.code == "retries_exhausted"
    assert "timeout_ms=250" in effect.error.message


async def test_a_takeover_continues_the_count(harness: StoreHarness) -> None:
    """A worker that died after two recorded tries: the next owner runs try 3."""
    ledger, _ = timed(harness)
    begun = await ledger.begin(CALL)
    for n in (1, 2):
        assert await harness.store.record_try(
            begun.effect.id,
            attempt=1,
            error=down(n),
            error_type="ConnectionError",
        )
    await harness.age(60_000)  # the first worker stopped heartbeating long ago
    handler, calls = failing(ConnectionError("still down"))
    assert await ledger.run(CALL, handler, RunOptions(retry=POLICY)) == "ok"
    assert [c.tries for c in calls] == [2, 3], "the taker started at try 3"
    effect = await stored(ledger)
    assert (effect.attempt, effect.tries, effect.status) == (2, 4, EffectStatus.SUCCEEDED)
    assert [(t.number, t.attempt) for t in failures(effect)] == [(1, 1), (2, 1), (3, 2)]
    assert effect.tries <= POLICY.attempts


async def test_a_takeover_with_no_tries_left_runs_nothing(harness: StoreHarness) -> None:
    """The last holder used every try and died before recording the outcome."""
    ledger, _ = timed(harness)
    begun = await ledger.begin(CALL)
    for n in (1, 2, 3):
        await harness.store.record_try(
            begun.effect.id,
            attempt=1,
            error=down(n),
            error_type="ConnectionError",
        )
    await harness.age(60_000)
    handler, calls = failing()
    policy = RetryPolicy(on=ConnectionError, attempts=3)
    with pytest.raises(EffectFailedError) as failed:
        await ledger.run(CALL, handler, RunOptions(retry=policy))
    assert calls == []
    assert failed.value.code == "retries_exhausted"
    assert "down 3" in failed.value.message
    effect = await stored(ledger)
    assert (effect.status, effect.tries) == (EffectStatus.FAILED, 3)


async def test_a_worker_taken_over_stops_trying(harness: StoreHarness) -> None:
    """Its fenced record of the failed try is refused; it runs no second try, and its
    run() returns the new owner's outcome."""
    ledger, clock = timed(harness)
    started, fail_now = asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    async def stalls_then_fails(effect: Effect) -> str:
        calls.append(effect.attempt)
        started.set()
        await fail_now.wait()
        raise ConnectionError("reset")

    old = asyncio.create_task(ledger.run(CALL, stalls_then_fails, RunOptions(retry=POLICY)))
    await started.wait()
    await harness.age(60_000)
    taken = await harness.store.claim(ledger.idem_key(CALL), stale_after_ms=1_000)
    assert taken.claimed and taken.effect is not None and taken.effect.attempt == 2
    fail_now.set()
    effect = taken.effect
    for _ in range(200):  # the old worker's refused record, then its wait
        await asyncio.sleep(0)
    assert not await harness.store.record_try(
        effect.id, attempt=1, error=down(9), error_type="ConnectionError"
    ), "a record fenced by the old attempt is refused"
    assert await harness.store.commit(
        effect.id, attempt=2, status=EffectStatus.SUCCEEDED, result_json='"taker"', error=None
    )
    assert await asyncio.wait_for(old, 30) == "taker"
    assert calls == [1] and clock.slept == [], "the old worker tried no more"
    final = await stored(ledger)
    assert (final.tries, final.history) == (1, ())


async def test_no_retries_inside_a_transaction(harness: StoreHarness) -> None:
    """Refused before anything is stored: the waits would hold the transaction's locks."""
    ledger, _ = timed(harness)
    handler, calls = failing()
    async with harness.store.transaction() as tx:
        with pytest.raises(EffectLedgerValidationError) as refused:
            await ledger.run(CALL, handler, RunOptions(retry=POLICY), tx=tx)
    assert refused.value.field == "retry"
    assert calls == [] and await harness.raw_count() == 0


async def test_without_a_policy_a_run_is_one_try(harness: StoreHarness) -> None:
    ledger, clock = timed(harness)
    handler, calls = failing(ConnectionError("reset"))
    with pytest.raises(ConnectionError):
        await ledger.run(CALL, handler)
    assert len(calls) == 1 and clock.slept == []
    effect = await stored(ledger)
    assert (effect.tries, effect.history) == (1, ())
    assert effect.error is not None and effect.error.code == "ConnectionError"


async def test_a_tool_retries_by_its_own_policy(harness: StoreHarness) -> None:
    """@ledger.tool(retry=...) is the tool's RunOptions.retry."""
    ledger, clock = timed(harness)
    calls: list[int] = []

    @ledger.tool("psp.charge", retry=RetryPolicy(on=TimeoutError, attempts=3, jitter=0))
    async def charge(order: str) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("psp timed out")
        return f"charged {order}"

    async with ledger.workflow("wf"):
        assert await charge("o42") == "charged o42"
        assert await charge(order="o42") == "charged o42"
    assert len(calls) == 3 and clock.slept == [0.2, 0.4]
    effect = await stored(ledger)
    assert effect.tries == 3


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_store_error_recording_a_try_counts_it_once(
    harness: StoreHarness, when: When
) -> None:
    """The record is tried again (after a lost reply: read back first), never twice."""
    store = FaultyStore(harness.store)
    clock = ManualClock()
    ledger = build_ledger(store, clock=clock)
    store.fail("record_try", when=when)
    handler, calls = failing(ConnectionError("reset"))
    assert await ledger.run(CALL, handler, RunOptions(retry=POLICY)) == "ok"
    effect = await stored(ledger)
    assert (len(calls), effect.tries, len(failures(effect))) == (2, 2, 1)
    assert store.failures["record_try"] == 1


def _ledger_sleeping_with(
    harness: StoreHarness, during_wait: Callable[[], object]
) -> tuple[EffectLedger, ManualClock]:
    """A ledger whose first wait between tries runs ``during_wait`` (something landing
    while the worker waits), then moves the clock as a ManualClock's sleep does."""
    clock = ManualClock()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:
            result = during_wait()
            if asyncio.iscoroutine(result):
                await result
        await clock.sleep(seconds)

    ledger = EffectLedger(EffectLedgerOptions(store=harness.store, clock=clock, sleep=sleep))
    return ledger, clock


async def test_a_cancel_during_the_wait_stops_the_next_try(harness: StoreHarness) -> None:
    """cancel() landing while the worker waits to retry: no further try runs."""
    box: list[EffectLedger] = []
    ledger, _ = _ledger_sleeping_with(
        harness, lambda: box[0].cancel(box[0].idem_key(CALL), reason="stop", by="ops")
    )
    box.append(ledger)
    handler, calls = failing(ConnectionError("down"), then="charged")
    with pytest.raises(EffectDeniedError):
        await ledger.run(CALL, handler, RunOptions(retry=POLICY))
    assert len(calls) == 1, "the handler ran again after the cancel"
    assert (await stored(ledger)).status is EffectStatus.CANCELED


async def test_a_takeover_during_the_wait_stops_the_next_try(harness: StoreHarness) -> None:
    """This worker's heartbeats stopped getting through and another took the effect
    over while it waited: it must not make another try (the total would pass attempts)."""
    box: list[EffectLedger] = []

    async def taken_over() -> None:
        await harness.age(60_000)
        taken = await harness.store.claim(box[0].idem_key(CALL), stale_after_ms=1_000)
        assert taken.claimed and taken.effect is not None
        assert await harness.store.commit(
            taken.effect.id,
            attempt=taken.effect.attempt,
            status=EffectStatus.SUCCEEDED,
            result_json='"taker"',
            error=None,
        )

    ledger, _ = _ledger_sleeping_with(harness, taken_over)
    box.append(ledger)
    handler, calls = failing(ConnectionError("down"), then="mine")
    assert await ledger.run(CALL, handler, RunOptions(retry=POLICY)) == "taker"
    assert len(calls) == 1, "the old worker tried again after the takeover"


async def test_a_huge_integer_retry_after_is_ignored(harness: StoreHarness) -> None:
    ledger, clock = timed(harness)
    policy = RetryPolicy(on=RateLimited, attempts=2, initial_ms=50, max_ms=1_000, jitter=0)
    handler, _ = failing(RateLimited(10**400))
    assert await ledger.run(CALL, handler, RunOptions(retry=policy)) == "ok"
    assert clock.slept == [0.05]


async def test_a_truthy_non_retryable_is_an_opt_out(harness: StoreHarness) -> None:
    class Opaque(ConnectionError):
        non_retryable = 1

    ledger, _ = timed(harness)
    handler, calls = failing(Opaque("no"))
    with pytest.raises(Opaque):
        await ledger.run(CALL, handler, RunOptions(retry=POLICY))
    assert len(calls) == 1
