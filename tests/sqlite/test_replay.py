"""A replay on SQLite is one read that never takes the write lock; duplicate counts
land later, in batches, and a flush never waits long for the lock (issue 14)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_ledger import ToolCall
from agent_ledger.errors import EffectLedgerValidationError, EffectStoreError
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.testing import build_ledger

CALL = ToolCall(workflow_id="wf", tool="charge", args={"amount": 5})


@contextlib.contextmanager
def write_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the write lock (BEGIN IMMEDIATE, left open)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def stored_count(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT dedup_count FROM agent_ledger_effects").fetchone()[0])


async def test_a_replay_does_not_need_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, busy_timeout_ms=5_000, dedup_flush_interval_s=3600)
    try:
        ledger = build_ledger(store)
        await ledger.run(CALL, lambda e: "ok")
        with write_lock(path):
            async with asyncio.timeout(2):  # far below the 5 s busy timeout
                for _ in range(5):
                    assert await ledger.run(CALL, lambda e: "again") == "ok"
            # The flush needs the lock: it gives up fast, keeping the counts.
            with pytest.raises(EffectStoreError, match="flush_counts"):
                async with asyncio.timeout(2):
                    await store.flush_counts()
        effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
        assert effect is not None and effect.dedup_count == 5
        assert stored_count(path) == 0
        await store.flush_counts()
        assert stored_count(path) == 5
    finally:
        await store.close()


async def test_close_writes_the_counts_and_another_store_sees_them(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, dedup_flush_interval_s=3600)
    other = SqliteStore(path)
    try:
        ledger = build_ledger(store)
        await ledger.run(CALL, lambda e: "ok")
        for _ in range(3):
            await ledger.run(CALL, lambda e: "again")
        key = ledger.idem_key(CALL)
        seen = await other.find(key)
        assert seen is not None and seen.dedup_count == 0
        await store.flush_counts()
        seen = await other.find(key)
        assert seen is not None and seen.dedup_count == 3
        await ledger.run(CALL, lambda e: "again")
        await store.close()
        seen = await other.find(key)
        assert seen is not None and seen.dedup_count == 4
        assert (await other.stats()).duplicates == 4
    finally:
        await store.close()
        await other.close()


async def test_the_timer_writes_counts_without_being_asked(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, dedup_flush_interval_s=0.05)
    try:
        ledger = build_ledger(store)
        await ledger.run(CALL, lambda e: "ok")
        await ledger.run(CALL, lambda e: "again")
        async with asyncio.timeout(5):
            while stored_count(path) != 1:
                await asyncio.sleep(0.02)
    finally:
        await store.close()


@pytest.mark.parametrize("interval", [0, -1, 3601, float("nan"), "1", True])
def test_a_bad_flush_interval_is_refused(tmp_path: Path, interval: object) -> None:
    with pytest.raises(EffectLedgerValidationError, match="dedup_flush_interval_s"):
        SqliteStore(tmp_path / "ledger.db", dedup_flush_interval_s=interval)  # type: ignore[arg-type]
    assert not (tmp_path / "ledger.db").exists()


async def test_stats_writes_the_pending_counts_first(tmp_path: Path) -> None:
    """An aggregate cannot add pending counts per row: stats() writes them, so it adds up."""
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, dedup_flush_interval_s=3600)
    try:
        ledger = build_ledger(store)
        await ledger.run(CALL, lambda e: "ok")
        for _ in range(3):
            await ledger.run(CALL, lambda e: "again")
        assert stored_count(path) == 0
        assert (await ledger.stats()).duplicates == 3
        assert stored_count(path) == 3
    finally:
        await store.close()


async def test_stats_answers_under_another_writers_lock_with_the_pending_counts(
    tmp_path: Path,
) -> None:
    """stats() is a read: when its flush cannot get the write lock, the pending counts
    (of effects still stored) are added to the totals instead of failing."""
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, busy_timeout_ms=5_000, dedup_flush_interval_s=3600)
    try:
        ledger = build_ledger(store)
        await ledger.run(CALL, lambda e: "ok")
        await ledger.run(ToolCall(workflow_id="wf", tool="other", args={}), lambda e: "ok")
        with write_lock(path):
            for _ in range(3):
                await ledger.run(CALL, lambda e: "again")
            async with asyncio.timeout(2):
                stats = await ledger.stats()
        assert stats.duplicates == 3 and stats.total == 2
        assert stored_count_of(path, "charge") == 0
        # Written once the lock is free, and not counted twice.
        assert (await ledger.stats()).duplicates == 3
        assert stored_count_of(path, "charge") == 3
    finally:
        await store.close()


async def test_close_waits_for_the_write_lock_up_to_the_busy_timeout(tmp_path: Path) -> None:
    """close() is the last chance to write the counts: it waits for another writer's
    lock as long as busy_timeout_ms allows, not the 100 ms of other flushes."""
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, busy_timeout_ms=5_000, dedup_flush_interval_s=3600)
    ledger = build_ledger(store)
    await ledger.run(CALL, lambda e: "ok")
    for _ in range(2):
        await ledger.run(CALL, lambda e: "again")
    other = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = asyncio.get_running_loop().call_later(0.5, other.execute, "ROLLBACK")
    try:
        await store.close()
    finally:
        release.cancel()
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
    assert stored_count(path) == 2


def stored_count_of(path: Path, tool: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        query = "SELECT dedup_count FROM agent_ledger_effects WHERE tool = ?"
        return int(conn.execute(query, (tool,)).fetchone()[0])


async def test_a_read_inside_a_transaction_never_waits_for_a_flush(tmp_path: Path) -> None:
    """A flush waits for the store's open transaction to end; a read inside that
    transaction which overlapped the flush must not wait for the flush in turn
    (it did: the two waited for each other for ever). Its count is still exact."""
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, dedup_flush_interval_s=3600)
    try:
        ledger = build_ledger(store)
        await ledger.run(CALL, lambda e: "ok")
        for _ in range(3):
            await ledger.run(CALL, lambda e: "again")
        key = ledger.idem_key(CALL)
        opened = asyncio.Event()

        async def flush_elsewhere() -> None:
            # Started before the block, so not part of it: the flush waits for it.
            await opened.wait()
            await store.flush_counts()

        flushing = asyncio.create_task(flush_elsewhere())
        async with store.transaction() as tx:
            opened.set()
            for _ in range(5):  # the flush starts and waits for the transaction
                await asyncio.sleep(0)
            async with asyncio.timeout(5):
                seen = await store.find(key, tx=tx)
            assert seen is not None and seen.dedup_count == 3
            assert not flushing.done()
            assert stored_count(path) == 0
        await flushing
        assert stored_count(path) == 3
        seen = await store.find(key)
        assert seen is not None and seen.dedup_count == 3
    finally:
        await store.close()
