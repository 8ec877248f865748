"""Many callers, one key: exactly one execution, everybody gets the same outcome."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_ledger import Effect, EffectFailedError, RunOptions, ToolCall
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="payments.charge", args={"cents": 500})
FAST_POLL = ConcurrencyOptions(initial_interval_ms=5, max_interval_ms=20)


async def test_fifty_concurrent_runs_execute_once(harness: StoreHarness) -> None:
    """50 tasks race on one call: one handler execution, 50 identical results."""
    ledger = harness.ledger(RunOptions(concurrency=FAST_POLL))
    executions = 0

    async def charge(effect: Effect) -> dict[str, object]:
        nonlocal executions
        executions += 1
        await asyncio.sleep(0.05)
        return {"charge": "ch_1", "attempt": effect.attempt}

    results = await asyncio.gather(*(ledger.run(CALL, charge) for _ in range(50)))
    assert executions == 1
    assert all(r == {"charge": "ch_1", "attempt": 1} for r in results)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.dedup_count == 49


async def test_waiters_get_the_winners_failure(harness: StoreHarness) -> None:
    """When the one execution fails, it re-raises its exception; waiters get EffectFailedError."""
    ledger = harness.ledger(RunOptions(concurrency=FAST_POLL))
    executions = 0

    async def declines(effect: Effect) -> None:
        nonlocal executions
        executions += 1
        await asyncio.sleep(0.05)
        raise ValueError("card declined")

    outcomes = await asyncio.gather(
        *(ledger.run(CALL, declines) for _ in range(10)), return_exceptions=True
    )
    assert executions == 1
    assert sum(isinstance(o, ValueError) for o in outcomes) == 1
    failed = [o for o in outcomes if isinstance(o, EffectFailedError)]
    assert len(failed) == 9
    assert {(f.message, f.code) for f in failed} == {("card declined", "ValueError")}


async def test_waiter_is_woken_by_the_commit_not_the_poll(harness: StoreHarness) -> None:
    """With a 5 s poll interval, a waiter still returns right after the winner commits."""
    slow_poll = ConcurrencyOptions(
        initial_interval_ms=5_000, max_interval_ms=5_000, jitter_factor=0
    )
    ledger = harness.ledger(RunOptions(concurrency=slow_poll, stale=StaleOptions(after_ms=0)))
    release = asyncio.Event()

    async def gated(effect: Effect) -> str:
        await release.wait()
        return "done"

    owner = asyncio.create_task(ledger.run(CALL, gated))
    await asyncio.sleep(0.05)
    waiter = asyncio.create_task(ledger.run(CALL, gated))
    await asyncio.sleep(0.1)  # the waiter has polled once and sleeps on its 5 s interval
    started = time.monotonic()
    release.set()
    assert await asyncio.wait_for(waiter, timeout=2) == "done"
    assert time.monotonic() - started < 2
    assert await owner == "done"


async def test_wait_timeout_raises_within_timeout_plus_one_interval(harness: StoreHarness) -> None:
    """EffectTimeoutError arrives near wait_timeout_ms and says how long it waited."""
    options = RunOptions(
        concurrency=ConcurrencyOptions(
            wait_timeout_ms=200, initial_interval_ms=20, max_interval_ms=50
        ),
        stale=StaleOptions(after_ms=0),
    )
    ledger = harness.ledger(options)
    begun = await ledger.begin(CALL)  # held, never committed
    started = time.monotonic()
    with pytest.raises(
        EffectTimeoutError, match=r"gave up after waiting \d+ ms \(limit 200 ms\)"
    ) as info:
        await ledger.run(CALL, lambda effect: "never")
    elapsed_ms = (time.monotonic() - started) * 1000
    assert 200 <= elapsed_ms < 200 + 50 + 500  # timeout + one max interval + scheduling slack
    assert info.value.status == "processing"
    assert info.value.waited_ms >= 200
    still = await ledger.get_effect(begun.effect.id)
    assert still is not None and still.status.value == "processing"


async def test_zero_wait_timeout_fails_fast(harness: StoreHarness) -> None:
    """wait_timeout_ms=0 means: do not wait for another caller at all."""
    ledger = harness.ledger(RunOptions(stale=StaleOptions(after_ms=0)))
    await ledger.begin(CALL)
    with pytest.raises(EffectTimeoutError):
        await ledger.run(
            CALL, lambda e: 1, RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=0))
        )


async def test_cancelled_waiter_leaves_the_effect_alone(harness: StoreHarness) -> None:
    """Cancelling a waiting run() does not touch the effect the owner is running."""
    ledger = harness.ledger(RunOptions(concurrency=FAST_POLL))
    release = asyncio.Event()

    async def gated(effect: Effect) -> str:
        await release.wait()
        return "owner"

    owner = asyncio.create_task(ledger.run(CALL, gated))
    await asyncio.sleep(0.05)
    waiter = asyncio.create_task(ledger.run(CALL, gated))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status.value == "processing" and effect.attempt == 1
    release.set()
    assert await owner == "owner"
