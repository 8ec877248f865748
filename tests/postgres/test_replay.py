"""A replay on PostgreSQL is one read: no transaction id (so no WAL and no flush wait
at commit), no row lock; duplicate counts land later, in batches (issue 14)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agent_ledger import ToolCall
from agent_ledger.effects import CommitSucceeded
from agent_ledger.stores._params import begin_params
from agent_ledger.stores.base import NewEffect
from agent_ledger.stores.postgres import _FINISHED, PostgresStore
from agent_ledger.testing import build_ledger
from tests.harness import PostgresHarness

CALL = ToolCall(workflow_id="wf", tool="charge", args={"amount": 5})


def _table(schema: str) -> sql.Composed:
    return sql.SQL("{}").format(sql.Identifier(schema, "agent_ledger_effects"))


async def _row(conn: Any, schema: str, key: str) -> tuple[Any, ...]:
    cursor = await conn.execute(
        sql.SQL("SELECT dedup_count, xmin::text FROM {} WHERE idem_key = %s").format(
            _table(schema)
        ),
        (key,),
    )
    row = await cursor.fetchone()
    assert row is not None
    return tuple(row)


async def _xid_of(pg: PostgresHarness, statement: Any, params: Mapping[str, object]) -> object:
    """Run one of begin's statements inside a transaction of the back door and say
    whether it was given a transaction id (what makes a commit write and flush WAL)."""
    async with pg.backdoor.transaction(force_rollback=True):
        await pg.backdoor.execute(statement, params)
        cursor = await pg.backdoor.execute("SELECT pg_current_xact_id_if_assigned()")
        row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def _xid_of_begin(pg: PostgresHarness, key: str) -> object:
    new = NewEffect(idem_key=key, workflow_id="wf", call_id=None, tool="charge",
                    args_canonical="{}", resource_id_canonical=None)  # fmt: skip
    return await _xid_of(pg, pg.store._begin, {**begin_params(new), "lock_timeout": None})


async def test_a_replay_of_a_finished_effect_gets_no_transaction_id(
    pg: PostgresHarness,
) -> None:
    """No xid: begin's statement writes nothing for an existing key, so no WAL record
    and no flush wait at commit. Only a caller that may wait (the effect is still
    open) sends a second statement, which counts its duplicate at once: that writes."""
    ledger = build_ledger(pg.store)
    begun = await ledger.begin(CALL)
    key = begun.effect.idem_key
    assert await _xid_of_begin(pg, key) is None  # processing: read only
    count = {"id": begun.effect.id, "finished": _FINISHED, "lock_timeout": None}
    assert await _xid_of(pg, pg.store._count_waiting, count) is not None  # counted, written
    assert await ledger.commit(begun.effect.id, CommitSucceeded(result="ok"))
    assert await _xid_of_begin(pg, key) is None  # finished: read only
    assert await _xid_of(pg, pg.store._count_waiting, count) is None  # finished: not counted


async def test_replays_leave_the_row_untouched_until_the_flush(
    pg: PostgresHarness, schema: str
) -> None:
    ledger = build_ledger(pg.store)
    await ledger.run(CALL, lambda e: "ok")
    key = ledger.idem_key(CALL)
    before = await _row(pg.backdoor, schema, key)
    for _ in range(20):
        assert await ledger.run(CALL, lambda e: "again") == "ok"
    assert await _row(pg.backdoor, schema, key) == before  # same version: no write
    await pg.store.flush_counts()
    count, xmin = await _row(pg.backdoor, schema, key)
    assert count == 20 and xmin != before[1]


async def test_a_replay_does_not_wait_for_a_row_lock(pg: PostgresHarness, schema: str) -> None:
    """Another transaction holds the finished row FOR UPDATE: replays still answer at once
    (the old upsert queued behind that lock), and the flush skips the locked row, keeping
    its counts for the next flush instead of waiting."""
    ledger = build_ledger(pg.store)
    await ledger.run(CALL, lambda e: "ok")
    key = ledger.idem_key(CALL)
    locker = await psycopg.AsyncConnection.connect(pg.backdoor.info.dsn)
    try:
        await locker.execute(
            sql.SQL("SELECT 1 FROM {} WHERE idem_key = %s FOR UPDATE").format(_table(schema)),
            (key,),
        )
        async with asyncio.timeout(5):
            for _ in range(5):
                assert await ledger.run(CALL, lambda e: "again") == "ok"
            await pg.store.flush_counts()  # skips the locked row: does not wait
        assert (await _row(pg.backdoor, schema, key))[0] == 0
        effect = await ledger.find_by_idem_key(key)
        assert effect is not None and effect.dedup_count == 5  # still pending, still shown
        await locker.rollback()
        await pg.store.flush_counts()
        assert (await _row(pg.backdoor, schema, key))[0] == 5
    finally:
        await locker.close()


async def test_another_process_sees_the_counts_after_a_flush_and_after_close(
    pg: PostgresHarness, dsn: str, schema: str
) -> None:
    other = await PostgresStore.connect(dsn, schema=schema, max_size=2)
    writer = await PostgresStore.connect(
        dsn, schema=schema, max_size=2, dedup_flush_interval_s=3600
    )
    try:
        ledger = build_ledger(writer)
        await ledger.run(CALL, lambda e: "ok")
        key = ledger.idem_key(CALL)
        for _ in range(3):
            await ledger.run(CALL, lambda e: "again")
        seen = await other.find(key)
        assert seen is not None and seen.dedup_count == 0  # not written yet
        await writer.flush_counts()
        seen = await other.find(key)
        assert seen is not None and seen.dedup_count == 3
        for _ in range(2):
            await ledger.run(CALL, lambda e: "again")
        await writer.close()  # writes the last two
        seen = await other.find(key)
        assert seen is not None and seen.dedup_count == 5
        assert (await other.stats()).duplicates == 5
    finally:
        await writer.close()
        await other.close()


async def test_the_timer_writes_counts_without_being_asked(dsn: str, schema: str) -> None:
    writer = await PostgresStore.connect(
        dsn, schema=schema, max_size=2, dedup_flush_interval_s=0.05
    )
    other = await PostgresStore.connect(dsn, schema=schema, max_size=2)
    try:
        ledger = build_ledger(writer)
        call = ToolCall(workflow_id="timer", tool="t", args={})
        await ledger.run(call, lambda e: "ok")
        await ledger.run(call, lambda e: "again")
        key = ledger.idem_key(call)
        async with asyncio.timeout(5):
            while (seen := await other.find(key)) is None or seen.dedup_count != 1:
                await asyncio.sleep(0.02)
    finally:
        await writer.close()
        await other.close()


async def test_the_flush_statement_commits_asynchronously(
    pg: PostgresHarness,
) -> None:
    """DEDUP_FLUSH turns synchronous_commit off for its own transaction only."""
    async with pg.backdoor.transaction(force_rollback=True):
        params = {"ids": ["00000000-0000-0000-0000-000000000000"], "counts": [1]}
        await pg.backdoor.execute(pg.store._dedup_flush, params)
        cursor = await pg.backdoor.execute("SHOW synchronous_commit")
        row = await cursor.fetchone()
        assert row is not None and row[0] == "off"
    cursor = await pg.backdoor.execute("SHOW synchronous_commit")
    row = await cursor.fetchone()
    assert row is not None and row[0] == "on"


async def test_replays_by_a_store_that_never_saw_the_key_and_by_one_that_did(
    pg: PostgresHarness, dsn: str, schema: str
) -> None:
    """The first begin of a key in a store is the insert-or-get statement; later ones
    read first. Both answer a replay with the outcome, and both counts land; a key
    that was reopened meanwhile is not a replay, and runs again."""
    stranger = await PostgresStore.connect(dsn, schema=schema, max_size=2)
    try:
        ledger = build_ledger(pg.store)
        other = build_ledger(stranger)
        assert await ledger.run(CALL, lambda e: "ok") == "ok"
        assert await other.run(CALL, lambda e: "again") == "ok"  # unknown there: BEGIN
        assert await other.run(CALL, lambda e: "again") == "ok"  # known now: a read
        assert await ledger.run(CALL, lambda e: "again") == "ok"  # known: a read
        await stranger.flush_counts()
        await pg.store.flush_counts()
        key = ledger.idem_key(CALL)
        assert (await _row(pg.backdoor, schema, key))[0] == 3
        failing = ToolCall(workflow_id="wf", tool="charge", args={"amount": 6})

        def boom(effect: object) -> None:
            raise RuntimeError("declined")

        with pytest.raises(RuntimeError):
            await ledger.run(failing, boom)
        assert await ledger.reopen(ledger.idem_key(failing), by="ops", reason="retry")
        assert await ledger.run(failing, lambda e: "second") == "second"
    finally:
        await stranger.close()


async def test_close_during_replays_leaves_no_timer_and_counts_only_answered_replays(
    dsn: str, schema: str
) -> None:
    """close() while replays run: each replay that read the finished effect returns its
    outcome (its count re-read after close is dropped, not raised); one that failed
    counts nothing; and no timer runs after close()."""
    # A key of its own: the session's schema is shared with other tests.
    closing = ToolCall(workflow_id=f"close-{uuid.uuid4()}", tool="charge", args={})
    store = await PostgresStore.connect(dsn, schema=schema, dedup_flush_interval_s=0.05)
    ledger = build_ledger(store)
    assert await ledger.run(closing, lambda e: "ok") == "ok"

    async def replay() -> bool:
        try:
            assert await ledger.run(closing, lambda e: "no") == "ok"
        except Exception:
            return False
        return True

    tasks = [asyncio.create_task(replay()) for _ in range(30)]
    await asyncio.sleep(0.002)
    await store.close()
    answered = sum(await asyncio.gather(*tasks))
    timer = store._counts._timer
    assert timer is None or timer.done()
    pending = sum(store._counts.pending.values())
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        (stored, _) = await _row(conn, schema, build_ledger(store).idem_key(closing))
        # Nothing more is written behind close()'s back.
        await asyncio.sleep(0.2)
        assert (await _row(conn, schema, build_ledger(store).idem_key(closing)))[0] == stored
    assert sum(store._counts.pending.values()) == pending
    # Every answered replay counted once (written by close, or kept after it); no other.
    assert stored + pending == answered


async def test_stats_includes_the_counts_the_flush_skipped_on_a_locked_row(
    dsn: str, schema: str
) -> None:
    """The flush skips a row another transaction holds locked; stats() then adds the
    counts it left pending, as find() does, rather than leave them out."""
    call = ToolCall(workflow_id=f"locked-{uuid.uuid4()}", tool="charge", args={})
    store = await PostgresStore.connect(dsn, schema=schema, dedup_flush_interval_s=3600)
    try:
        ledger = build_ledger(store)
        key = ledger.idem_key(call)
        assert await ledger.run(call, lambda e: "ok") == "ok"
        before = (await ledger.stats()).duplicates
        for _ in range(5):
            await ledger.run(call, lambda e: "again")
        async with await psycopg.AsyncConnection.connect(dsn) as locker:
            await locker.execute(
                sql.SQL("SELECT 1 FROM {} WHERE idem_key = %s FOR UPDATE").format(_table(schema)),
                (key,),
            )
            found = await ledger.find_by_idem_key(key)
            assert found is not None and found.dedup_count == 5
            assert (await ledger.stats()).duplicates == before + 5
            assert (await _row(locker, schema, key))[0] == 0  # not written: skipped
            await locker.rollback()
        # Written by the next flush, and counted once.
        assert (await ledger.stats()).duplicates == before + 5
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert (await _row(conn, schema, key))[0] == 5
    finally:
        await store.close()
