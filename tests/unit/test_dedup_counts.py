"""PendingCounts: the buffer behind the SQL stores' deferred duplicate counts.

The writer here is a small table in a dict that can be told to fail, to lose
its reply or to be slow: what is under test is the buffer (what it keeps,
drops, and never writes twice), which the store tests then run for real.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Mapping

import pytest

from agent_ledger.errors import EffectStoreError
from agent_ledger.stores._dedup import CountsLost, PendingCounts


class Table:
    """Where the counts land; ``fail``/``lose``/``busy``/``gate`` shape the next writes."""

    def __init__(self) -> None:
        self.rows: Counter[str] = Counter()
        self.fail = 0
        self.lose = 0
        self.busy: set[str] = set()
        self.gate: asyncio.Event | None = None
        self.writes = 0

    async def write(self, batch: Mapping[str, int]) -> Collection[str]:
        self.writes += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            self.fail -= 1
            raise EffectStoreError("refused", operation="flush_counts")
        applied = {k: n for k, n in batch.items() if k not in self.busy}
        self.rows.update(applied)
        if self.lose:
            self.lose -= 1
            raise CountsLost("the connection was lost")
        return [k for k in batch if k in self.busy]


def counts(table: Table, **kwargs: object) -> PendingCounts:
    return PendingCounts(table.write, interval_s=3600, store="test", **kwargs)  # type: ignore[arg-type]


async def test_a_failed_write_keeps_the_counts_for_the_next() -> None:
    table = Table()
    pending = counts(table)
    for key in "aab":
        pending.add(key)
    table.fail = 1
    with pytest.raises(EffectStoreError, match="refused"):
        await pending.flush()
    assert table.rows == {} and pending.unwritten("a") == 2
    pending.add("a")
    await pending.flush()
    assert table.rows == {"a": 3, "b": 1} and pending.unwritten("a") == 0
    await pending.close()


async def test_a_lost_reply_drops_the_batch_rather_than_write_it_twice() -> None:
    table = Table()
    pending = counts(table)
    pending.add("a")
    table.lose = 1
    with pytest.raises(CountsLost):
        await pending.flush()
    await pending.flush()  # nothing is sent again
    assert table.rows == {"a": 1} and table.writes == 1


async def test_busy_keys_wait_for_the_next_flush() -> None:
    table = Table()
    pending = counts(table)
    pending.add("a")
    pending.add("b")
    table.busy = {"b"}
    await pending.flush()
    assert table.rows == {"a": 1} and pending.unwritten("b") == 1
    table.busy = set()
    await pending.flush()
    assert table.rows == {"a": 1, "b": 1}


async def test_a_cancelled_caller_does_not_cancel_the_write() -> None:
    """The caller stops waiting; the write goes on, once, and nothing is lost."""
    table = Table()
    table.gate = asyncio.Event()
    pending = counts(table)
    for _ in range(3):
        pending.add("a")
    caller = asyncio.create_task(pending.flush())
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert pending.unwritten("a") == 3  # in flight: still shown, not yet written
    pending.add("a")
    table.gate.set()
    await pending.flush()
    assert table.rows == {"a": 4} and table.writes == 2
    assert pending.unwritten("a") == 0


async def test_a_read_that_overlaps_a_flush_of_its_key_is_ambiguous() -> None:
    table = Table()
    table.gate = asyncio.Event()
    pending = counts(table)
    pending.add("a")
    before = pending.epoch
    flushing = asyncio.create_task(pending.flush())
    while pending.epoch == before:
        await asyncio.sleep(0)
    assert pending.epoch == before + 1 and table.writes == 1
    pending.add("b")  # counted after the batch was taken: not in flight
    table.gate.set()
    await flushing
    # Only a flush of the row's own key makes a read ambiguous.
    assert pending.ambiguous([_row("a")], before)
    assert not pending.ambiguous([_row("b")], before)
    assert not pending.ambiguous([_row("a")], pending.epoch)


async def test_no_flush_starts_while_a_read_is_held_quiet() -> None:
    table = Table()
    pending = counts(table)
    pending.add("a")
    async with pending.quiet():
        flushing = asyncio.create_task(pending.flush())
        await asyncio.sleep(0.01)
        assert table.writes == 0 and not flushing.done()
    await flushing
    assert table.rows == {"a": 1}


async def test_keys_beyond_the_cap_are_dropped_but_known_keys_still_count() -> None:
    table = Table()
    pending = counts(table, max_keys=2)
    for key in "abcab":
        pending.add(key)
    await pending.flush()
    assert table.rows == {"a": 2, "b": 2}


async def test_the_timer_flushes_and_stops_when_idle() -> None:
    table = Table()
    pending = PendingCounts(table.write, interval_s=0.01, store="test")
    pending.add("a")
    async with asyncio.timeout(2):
        while table.rows != {"a": 1}:
            await asyncio.sleep(0.005)
        while pending._timer is not None and not pending._timer.done():
            await asyncio.sleep(0.005)
    pending.add("a")  # starts it again
    async with asyncio.timeout(2):
        while table.rows != {"a": 2}:
            await asyncio.sleep(0.005)
    await pending.close()


async def test_close_writes_what_is_pending_and_logs_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = Table()
    pending = counts(table)
    pending.add("a")
    await pending.close()
    assert table.rows == {"a": 1}
    pending.add("b")
    table.fail = 1
    await pending.close()  # does not raise
    assert "closed without writing 1 duplicate counts" in caplog.text


async def test_after_close_a_count_starts_no_timer_and_waits_for_a_flush() -> None:
    table = Table()
    pending = PendingCounts(table.write, interval_s=0.01, store="test")
    pending.add("a")
    await pending.close()
    assert table.rows == {"a": 1}
    pending.add("a")
    assert pending._timer is None
    await asyncio.sleep(0.05)
    assert table.writes == 1 and pending.unwritten("a") == 1
    await pending.flush()
    assert table.rows == {"a": 2}


def _row(key: str) -> tuple[object, ...]:
    from agent_ledger.stores._columns import ROW_COLUMNS

    row: list[object] = [None] * len(ROW_COLUMNS)
    row[ROW_COLUMNS.index("id")] = key
    return tuple(row)
