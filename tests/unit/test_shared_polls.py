"""Single-flight polling: many waiters, one read; nobody inherits another's fate."""

from __future__ import annotations

import asyncio
from typing import cast

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    MemoryStore,
    RunOptions,
    Store,
    ToolCall,
)
from agent_ledger.effects import CommitSucceeded
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.testing import FaultyStore
from tests.approvals import make_pending

CALL = ToolCall(workflow_id="wf", tool="t", args={})


def slow_reads() -> FaultyStore[MemoryStore]:
    """A MemoryStore whose reads take 50 ms, like a round trip to a busy server."""
    store = FaultyStore(MemoryStore())
    store.slow("find", "claim", seconds=0.05)
    return store


def reads(store: FaultyStore[MemoryStore]) -> int:
    return store.calls["find"] + store.calls["claim"]


def ledger_on(store: Store) -> EffectLedger:
    slow_poll = ConcurrencyOptions(
        initial_interval_ms=10_000, max_interval_ms=10_000, jitter_factor=0
    )
    run = RunOptions(concurrency=slow_poll, stale=StaleOptions(after_ms=0))
    return EffectLedger(EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=run)))


async def test_waiters_woken_together_share_one_read() -> None:
    """20 waiters woken by one commit cost far fewer than 20 reads, and all get the result."""
    store = slow_reads()
    ledger = ledger_on(store)
    begun = await ledger.begin(CALL)
    waiters = [asyncio.create_task(ledger.run(CALL, lambda e: "never")) for _ in range(20)]
    await asyncio.sleep(0.3)  # every waiter has made its first poll and sleeps
    reads_before = reads(store)
    await ledger.commit(begun.effect.id, CommitSucceeded(result={"items": [1]}))
    # The waiters replay the committed result, not what their handler would return.
    results = cast(list[dict[str, list[int]]], await asyncio.wait_for(asyncio.gather(*waiters), 5))
    assert results == [{"items": [1]}] * 20
    assert reads(store) - reads_before <= 3
    results[0]["items"].append(2)
    assert results[1] == {"items": [1]}, "each caller gets its own copy"


async def test_cancelling_the_poller_does_not_cancel_the_others() -> None:
    """If the waiter whose read the others joined is cancelled, they still finish."""
    store = slow_reads()
    ledger = ledger_on(store)
    begun = await ledger.begin(CALL)
    first = asyncio.create_task(ledger.run(CALL, lambda e: "never"))
    await asyncio.sleep(0.01)  # first is mid-read now
    others = [asyncio.create_task(ledger.run(CALL, lambda e: "never")) for _ in range(5)]
    await asyncio.sleep(0.01)  # the others joined that read
    first.cancel()
    await ledger.commit(begun.effect.id, CommitSucceeded(result="done"))
    assert await asyncio.wait_for(asyncio.gather(*others), 5) == ["done"] * 5
    assert first.cancelled()


async def test_a_shared_read_never_grants_ownership() -> None:
    """When a poll claims a ready effect, only the caller that sent it runs the handler."""
    store = slow_reads()
    ledger = ledger_on(store)
    key = (await make_pending(ledger, CALL)).idem_key
    executions = 0

    async def handler(effect: object) -> str:
        nonlocal executions
        executions += 1
        await asyncio.sleep(0.05)
        return "ran"

    approve_fast = RunOptions(
        concurrency=ConcurrencyOptions(initial_interval_ms=20, max_interval_ms=50)
    )
    waiters = [asyncio.create_task(ledger.run(CALL, handler, approve_fast)) for _ in range(10)]
    await asyncio.sleep(0.2)
    await ledger.approve(key)
    assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == ["ran"] * 10
    assert executions == 1
