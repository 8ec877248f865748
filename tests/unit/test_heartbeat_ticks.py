"""Heartbeat ticks: one batch per tick, shared by beats with different stale windows.

The schedule is simulated on a virtual clock through ``due_beats``, the one
place that decides which beats a tick sends. The last tests drive the task
itself on a real event loop.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    LedgerDefaults,
    RunOptions,
    ToolCall,
)
from agent_ledger.engine.heartbeats import EARLY_FRACTION, Beat, Heartbeats, due_beats
from agent_ledger.options import StaleOptions
from agent_ledger.stores.memory import MemoryStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def effect(n: int) -> Effect:
    return Effect(
        id=f"00000000-0000-4000-8000-{n:012d}", idem_key=f"{n:064x}", workflow_id="w",
        call_id=None, tool="t", status=EffectStatus.PROCESSING, args_canonical="{}",
        resource_id_canonical=None, result=None, error=None, dedup_count=0, attempt=1,
        created_at=NOW, updated_at=NOW, completed_at=None, heartbeat_at=NOW,
    )  # fmt: skip


def simulate(beats: list[Beat], until: float) -> list[list[Beat]]:
    """Run the tick schedule the heartbeat task follows, sending instantly."""
    ticks = []
    while (now := min(b.due for b in beats)) <= until:
        batch = due_beats(beats, now)
        for beat in batch:
            assert now <= beat.due, "a beat is never sent late"
            assert beat.due - now <= beat.interval_s * EARLY_FRACTION
            beat.due = now + beat.interval_s
        ticks.append(batch)
    return ticks


def beats(*specs: tuple[float, float]) -> list[Beat]:
    owner = Heartbeats(MemoryStore())
    return [Beat(owner, effect(n), interval, start) for n, (interval, start) in enumerate(specs)]


def test_a_longer_window_rides_along_with_the_shorter_ones_ticks() -> None:
    """Intervals of 1 s and 5 s: every tick is one the 1 s beat needs anyway."""
    fast, slow = beats((1.0, 0.0), (5.0, 0.3))
    ticks = simulate([fast, slow], until=60.0)
    assert all(fast in batch for batch in ticks)
    assert len(ticks) == 60
    assert sum(slow in batch for batch in ticks) >= 60 / 5


def test_beats_started_apart_fall_into_step() -> None:
    """Ten handlers started at different moments share one tick per interval."""
    group = beats(*((1.0, start / 10) for start in range(10)))
    ticks = simulate(group, until=30.0)
    assert len(ticks) <= 31
    assert all(len(batch) == 10 for batch in ticks[2:])


def test_a_beat_is_kept_alive_at_least_at_its_own_pace() -> None:
    """Unrelated windows (0.7 s and 1.1 s): each beat goes out within its interval."""
    group = beats((0.7, 0.0), (1.1, 0.05))
    ticks = simulate(group, until=100.0)
    for beat in group:
        sent = [i for i, batch in enumerate(ticks) if beat in batch]
        assert len(sent) >= 100 / beat.interval_s - 1
    assert len(ticks) < 100 / 0.7 + 100 / 1.1  # some ticks were shared


def test_a_beat_starts_confirmed_at_the_claim() -> None:
    """confirmed_at starts at the beat's start time and the first beat is due one interval on."""
    (beat,) = beats((2.0, 10.0))
    assert (beat.confirmed_at, beat.due) == (10.0, 12.0)
    assert beat.effect is not None  # an effect's beat (a saga's has none)
    assert beat.held == (beat.effect.id, beat.effect.attempt)


# -- the heartbeat task between handlers (real event loop) -----------------------------


async def test_back_to_back_runs_start_no_heartbeat_task() -> None:
    """Sequential calls must not start a task each: handlers that return before
    their first beat is due leave one timer armed and no task at all."""
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    heartbeats = ledger._engine._heartbeats
    timers = set()
    for i in range(20):
        await ledger.run(ToolCall(workflow_id="w", tool="t", args={"i": i}), lambda e: 1)
        assert heartbeats._task is None
        timers.add(heartbeats._timer)
    (timer,) = timers
    assert timer is not None and not timer.cancelled()


async def test_a_long_handler_starts_the_task_and_it_ends_with_the_handler() -> None:
    """A handler still running when its first beat falls due gets a task that
    beats for it; once the handler returns the task ends at once."""
    store = MemoryStore()
    ledger = EffectLedger(
        EffectLedgerOptions(
            store=store, defaults=LedgerDefaults(RunOptions(stale=StaleOptions(after_ms=150)))
        )
    )
    heartbeats = ledger._engine._heartbeats
    seen: list[asyncio.Task[None] | None] = []

    async def slow(effect: Effect) -> int:
        await asyncio.sleep(0.2)  # four beats of 50 ms
        seen.append(heartbeats._task)
        stored = await store.get(effect.id)
        assert stored is not None and stored.heartbeat_at > effect.heartbeat_at
        return 1

    assert await ledger.run(ToolCall(workflow_id="w", tool="t"), slow) == 1
    (task,) = seen
    assert task is not None
    await asyncio.wait_for(asyncio.shield(task), timeout=1.0)
    assert heartbeats._task is None


def test_closing_the_loop_after_the_last_call_leaves_no_pending_task() -> None:
    """An application that drives its own loop and closes it without cancelling
    anything must not get "Task was destroyed but it is pending"."""
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))

    async def calls() -> None:
        for i in range(5):
            await ledger.run(ToolCall(workflow_id="w", tool="t", args={"i": i}), lambda e: 1)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(calls())
        assert [t for t in asyncio.all_tasks(loop) if not t.done()] == []
    finally:
        loop.close()


async def test_a_shorter_beat_re_arms_the_timer_in_time() -> None:
    """A timer is armed for a 1 s interval; a handler with a 150 ms lease that runs
    400 ms must still be kept alive: its beat re-arms the timer earlier."""
    store = MemoryStore()
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    await ledger.run(
        ToolCall(workflow_id="w", tool="warm"),
        lambda e: 1,
        RunOptions(stale=StaleOptions(after_ms=3000)),
    )
    beats: list[datetime] = []

    async def slow(effect: Effect) -> int:
        for _ in range(8):
            await asyncio.sleep(0.05)
            stored = await store.get(effect.id)
            assert stored is not None
            beats.append(stored.heartbeat_at)
        return 1

    short = RunOptions(stale=StaleOptions(after_ms=150))
    running = asyncio.create_task(ledger.run(ToolCall(workflow_id="w", tool="t"), slow, short))
    await asyncio.sleep(0.3)
    # A second caller may take the effect over only if its heartbeats stopped.
    other = await store.claim(ledger.idem_key(ToolCall(workflow_id="w", tool="t")),
                              stale_after_ms=150)  # fmt: skip
    assert not other.claimed
    assert await running == 1
    assert len(set(beats)) >= 3  # refreshed several times while it ran
