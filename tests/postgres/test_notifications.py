"""LISTEN/NOTIFY: wake-ups survive a lost listener and respect transactions."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agent_ledger import Effect, RunOptions, ToolCall
from agent_ledger.effects import CommitSucceeded
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.testing import build_ledger

CALL = ToolCall(workflow_id="wf", tool="notify.me", args={})
SLOW_POLL = RunOptions(
    concurrency=ConcurrencyOptions(
        initial_interval_ms=30_000, max_interval_ms=30_000, jitter_factor=0
    ),
    stale=StaleOptions(after_ms=0),
)


async def terminate_listeners(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN %%' AND pid <> pg_backend_pid() "
            "AND application_name = current_setting('application_name')"
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


async def test_waiter_wakes_after_the_listener_connection_is_killed(pg: Any, dsn: str) -> None:
    """pg_terminate_backend on the listener: it reconnects and waiters still wake quickly."""
    ledger = build_ledger(pg.store, defaults=SLOW_POLL)
    release = asyncio.Event()

    async def gated(effect: Effect) -> str:
        await release.wait()
        return "done"

    owner = asyncio.create_task(ledger.run(CALL, gated))
    await asyncio.sleep(0.05)
    waiter = asyncio.create_task(ledger.run(CALL, gated))
    await asyncio.sleep(0.2)
    assert await terminate_listeners(dsn) >= 1
    await asyncio.sleep(0.5)  # reconnected by now (backoff starts at 50 ms)
    started = time.monotonic()
    release.set()
    assert await asyncio.wait_for(waiter, 5) == "done"
    assert time.monotonic() - started < 2.0
    assert await owner == "done"
    assert await terminate_listeners(dsn) >= 1, "the listener came back"


async def test_notification_from_a_transaction_arrives_at_commit(pg: Any, dsn: str) -> None:
    """A commit made inside a transaction wakes waiters only when the transaction commits."""
    ledger = build_ledger(pg.store, defaults=SLOW_POLL)
    begun = await ledger.begin(CALL)
    waiter = asyncio.create_task(ledger.run(CALL, lambda e: "never"))
    await asyncio.sleep(0.2)
    async with pg.store.transaction() as tx:
        assert await ledger.commit(begun.effect.id, CommitSucceeded(result="in tx"), tx=tx)
        await asyncio.sleep(0.3)
        assert not waiter.done()
    started = time.monotonic()
    assert await asyncio.wait_for(waiter, 5) == "in tx"
    assert time.monotonic() - started < 2.0


async def test_users_own_connection_as_tx_rolls_back_with_app_writes(
    pg: Any, dsn: str, schema: str
) -> None:
    """With the caller's psycopg connection as tx, the effect and the app's rows share a fate."""
    ledger = build_ledger(pg.store)
    orders = sql.Identifier(schema, "app_orders")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY)").format(orders)
        )
        await admin.execute(sql.SQL("TRUNCATE {}").format(orders))

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute(sql.SQL("INSERT INTO {} VALUES ('o-1')").format(orders))
                await ledger.run(CALL, lambda e: "charged", tx=conn)
                raise RuntimeError("payment provider said no after all")
        async with conn.transaction():
            await conn.execute(sql.SQL("INSERT INTO {} VALUES ('o-2')").format(orders))
            assert await ledger.run(CALL, lambda e: "charged again", tx=conn) == "charged again"

    assert await ledger.run(CALL, lambda e: "x") == "charged again"
    row = await pg._sql(sql.SQL("SELECT array_agg(id ORDER BY id) FROM {}").format(orders))
    assert row[0] == ["o-2"]


async def test_errors_from_the_callers_own_sql_in_a_transaction_are_not_wrapped(pg: Any) -> None:
    """Inside store.transaction(), the caller's failing SQL raises its own psycopg error."""
    with pytest.raises(psycopg.errors.UndefinedTable):
        async with pg.store.transaction() as tx:
            await tx.execute("SELECT * FROM no_such_table_for_agent_ledger")
