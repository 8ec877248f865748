"""Replays of finished effects, and duplicate counts that add up, on every store.

The SQL stores answer a replay with one read and write its duplicate count
later, in a batch (``stores/_dedup.py``); MemoryStore counts at once. Either
way a caller sees the same thing: the recorded outcome with no handler run,
and counts that add up, in this process at once and everywhere after
``flush_counts()``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from agent_ledger import Effect, EffectStatus, RunOptions, ToolCall
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.stores.base import EffectQuery
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="payments.charge", args={"cents": 500})
FAST_POLL = ConcurrencyOptions(initial_interval_ms=5, max_interval_ms=20)


def calls(n: int) -> list[ToolCall]:
    return [ToolCall(workflow_id="wf", tool="t", args={"i": i}) for i in range(n)]


async def test_a_replay_returns_the_recorded_result_without_running_the_handler(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    runs: list[int] = []

    def charge(effect: Effect) -> dict[str, str]:
        runs.append(effect.attempt)
        return {"charge": "ch_1"}

    assert await ledger.run(CALL, charge) == {"charge": "ch_1"}
    for _ in range(3):
        assert await ledger.run(CALL, charge) == {"charge": "ch_1"}
    begun = await ledger.begin(CALL)
    assert begun.cached and begun.cached_result == {"charge": "ch_1"}
    assert begun.effect.status is EffectStatus.SUCCEEDED
    assert runs == [1]
    # The effect a replay returns already counts that replay.
    assert begun.effect.dedup_count == 4


async def test_counts_of_many_concurrent_replays_add_up_after_a_flush(
    harness: StoreHarness,
) -> None:
    """40 tasks replay 4 finished keys 10 times each: every count lands exactly once."""
    ledger = harness.ledger()
    keys = calls(4)
    for call in keys:
        await ledger.run(call, lambda e: "done")

    async def replay(call: ToolCall) -> None:
        for _ in range(10):
            assert await ledger.run(call, lambda e: "again") == "done"

    await asyncio.gather(*(replay(call) for call in keys for _ in range(10)))
    # Read in this process before any flush: this process's counts are included.
    for call in keys:
        effect = await ledger.find_by_idem_key(ledger.idem_key(call))
        assert effect is not None and effect.dedup_count == 100
    await harness.store.flush_counts()
    await harness.store.flush_counts()  # nothing left: writes nothing twice
    for call in keys:
        effect = await ledger.find_by_idem_key(ledger.idem_key(call))
        assert effect is not None and effect.dedup_count == 100
    stats = await ledger.stats()
    assert stats.duplicates == 400
    listed = await harness.store.list_effects(_all())
    assert sorted(e.dedup_count for e in listed) == [100] * 4


async def test_reads_during_flushes_never_count_a_duplicate_twice_or_miss_one(
    harness: StoreHarness,
) -> None:
    """Reads racing flushes: each count lies between the replays finished before the read
    and those started by its end (a read that overlapped a flush is settled after it)."""
    ledger = harness.ledger()
    await ledger.run(CALL, lambda e: "done")
    key = ledger.idem_key(CALL)
    started = finished = 0
    stop = False

    async def replays() -> None:
        nonlocal started, finished
        for _ in range(60):
            started += 1
            await ledger.run(CALL, lambda e: "again")
            finished += 1

    async def flushes() -> None:
        while not stop:
            await harness.store.flush_counts()
            await asyncio.sleep(0)

    async def reads() -> None:
        while not stop:
            low = finished
            effect = await ledger.find_by_idem_key(key)
            high = started
            assert effect is not None and low <= effect.dedup_count <= high
            await asyncio.sleep(0)  # MemoryStore's reads never yield

    flusher = asyncio.create_task(flushes())
    readers = [asyncio.create_task(reads()) for _ in range(3)]
    await asyncio.gather(*(replays() for _ in range(4)))
    stop = True
    await asyncio.gather(flusher, *readers)
    await harness.store.flush_counts()
    effect = await ledger.find_by_idem_key(key)
    assert effect is not None and effect.dedup_count == 240


async def test_many_tasks_racing_a_new_key_run_it_once_and_all_get_its_outcome(
    harness: StoreHarness,
) -> None:
    """The race a one-read replay must not lose: a first insert committing while
    others look the key up. One handler run; everyone gets its result."""
    ledger = harness.ledger(RunOptions(concurrency=FAST_POLL))
    for round_ in range(5):
        call = ToolCall(workflow_id="race", tool="t", args={"round": round_})
        runs = 0

        async def once(effect: Effect, round_: int = round_) -> int:
            nonlocal runs
            runs += 1
            return round_

        results = await asyncio.gather(*(ledger.run(call, once) for _ in range(30)))
        assert runs == 1 and results == [round_] * 30
        await harness.store.flush_counts()
        effect = await ledger.find_by_idem_key(ledger.idem_key(call))
        assert effect is not None and effect.dedup_count == 29


async def test_a_replay_inside_a_transaction_returns_the_outcome_and_counts_nothing(
    harness: StoreHarness,
) -> None:
    """Inside tx= a replay is read only, as before: the outcome, no handler, no count."""
    ledger = harness.ledger()
    await ledger.run(CALL, lambda e: "first")
    await ledger.run(CALL, lambda e: "x")  # one duplicate outside, maybe not yet written
    async with harness.store.transaction() as tx:
        assert await ledger.run(CALL, lambda e: "y", tx=tx) == "first"
        inside = await harness.store.find(ledger.idem_key(CALL), tx=tx)
        assert inside is not None and inside.dedup_count == 1
    await harness.store.flush_counts()
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.dedup_count == 1


async def test_duplicates_of_an_open_effect_are_counted_too(harness: StoreHarness) -> None:
    """Waiters on a running effect and replays after it finished all count."""
    ledger = harness.ledger(RunOptions(concurrency=FAST_POLL))
    release = asyncio.Event()

    async def slow(effect: Effect) -> str:
        await release.wait()
        return "done"

    owner = asyncio.create_task(ledger.run(CALL, slow))
    await asyncio.sleep(0.05)
    waiters = [asyncio.create_task(ledger.run(CALL, slow)) for _ in range(3)]
    await asyncio.sleep(0.05)
    release.set()
    assert await asyncio.gather(owner, *waiters) == ["done"] * 4
    for _ in range(2):
        await ledger.run(CALL, slow)
    await harness.store.flush_counts()
    assert (await ledger.stats()).duplicates == 5


async def test_counts_of_a_purged_effect_never_land_on_a_new_effect_of_its_key(
    harness: StoreHarness,
) -> None:
    """Replays of an effect counted, not yet written, then the effect purged and its key
    used again: the new effect was never replayed, so it counts 0, before and after a
    flush, and so does stats() (a count may come out low, never high)."""
    ledger = harness.ledger()
    key = ledger.idem_key(CALL)
    await ledger.run(CALL, lambda e: "first")
    for _ in range(3):
        assert await ledger.run(CALL, lambda e: "again") == "first"
    old = await ledger.find_by_idem_key(key)
    assert old is not None and old.dedup_count == 3
    await harness.age(1000)
    assert await ledger.purge(timedelta(0)) == 1
    assert await ledger.run(CALL, lambda e: "second") == "second"
    new = await ledger.find_by_idem_key(key)
    assert new is not None and new.id != old.id and new.dedup_count == 0
    assert (await ledger.stats()).duplicates == 0
    await harness.store.flush_counts()
    new = await ledger.find_by_idem_key(key)
    assert new is not None and new.dedup_count == 0
    assert (await ledger.stats()).duplicates == 0


def _all() -> EffectQuery:
    return EffectQuery()
