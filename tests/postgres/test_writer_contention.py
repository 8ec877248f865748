"""PostgreSQL holds under the writer attacks that took live workers over on SQLite.

Issue 26, item 1 (the SQLite side: ``tests/reliability/test_writer_contention.py``).
A worker runs a call (lease 600 ms) whose handler works for three leases,
while a rival ledger on its own pool asks for the same call, and another
connection writes to the effects table meanwhile: a transaction held for
three leases and then killed (``pg_terminate_backend``), a stream of 45 ms
transactions, or one long purge-like delete held past the lease. PostgreSQL
locks rows, not the table, so the worker's heartbeats keep landing: the
handler runs once every time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agent_ledger import Effect, RunOptions, ToolCall
from agent_ledger.options import StaleOptions
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger

AFTER_MS = 600
OPTIONS = RunOptions(stale=StaleOptions(after_ms=AFTER_MS))
FILL = (
    "INSERT INTO {} (idem_key, workflow_id, tool, status, args_canonical)"
    " SELECT 'old-' || i || '-' || %s, 'old', 'old.tool', 'succeeded', '{{}}'"
    " FROM generate_series(1, %s) AS i"
)


async def attack(dsn: str, table: sql.Composed, kind: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        if kind == "killed":
            victim = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            await victim.execute("BEGIN")
            await victim.execute(sql.SQL(FILL).format(table), ("killed", 100))
            pid = victim.info.backend_pid
            await asyncio.sleep(3 * AFTER_MS / 1000)
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await victim.close()
        elif kind == "stream":
            for n in range(int(3 * AFTER_MS / 45)):
                async with conn.transaction():
                    await conn.execute(sql.SQL(FILL).format(table), (f"s{n}", 10))
                    await conn.execute("SELECT pg_sleep(0.045)")
        else:
            await conn.execute(sql.SQL(FILL).format(table), ("purge", 20_000))
            async with conn.transaction():
                await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE workflow_id = 'old'").format(table)
                )
                await conn.execute("SELECT pg_sleep(%s)", (2 * AFTER_MS / 1000,))


@pytest.mark.parametrize("kind", ["killed", "stream", "purge"])
async def test_writers_never_get_a_live_worker_taken_over(dsn: str, schema: str, kind: str) -> None:
    store = await PostgresStore.connect(dsn, schema=schema)
    other = await PostgresStore.connect(dsn, schema=schema)
    table = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier("agent_ledger_effects"))
    ledger, rival = build_ledger(store, defaults=OPTIONS), build_ledger(other, defaults=OPTIONS)
    call = ToolCall(workflow_id=f"contention-{kind}", tool="payments.charge", args={"cents": 1})
    runs: list[int] = []
    started = asyncio.Event()

    async def charge(effect: Effect) -> str:
        runs.append(effect.attempt)
        started.set()
        await asyncio.sleep(4 * AFTER_MS / 1000)
        return "ch_1"

    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(ledger.run(call, charge))]
    try:
        await started.wait()
        tasks.append(asyncio.create_task(rival.run(call, charge)))
        await attack(dsn, table, kind)
        assert await asyncio.gather(*tasks) == ["ch_1", "ch_1"]
        assert runs == [1], "a live worker was taken over"
    finally:
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()
        await other.close()
