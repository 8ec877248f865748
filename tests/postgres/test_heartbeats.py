"""PostgreSQL heartbeats: a connection of their own, one statement per batch, no lock waits."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from agent_ledger import Effect, RunOptions, ToolCall
from agent_ledger.options import StaleOptions
from agent_ledger.stores.base import HeartbeatOutcome, Held
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger
from tests.harness import DSN, TEST_SCHEMA


async def test_a_row_locked_elsewhere_is_skipped_not_waited_for(pg: Any) -> None:
    """Another transaction holding one effect's row lock delays no heartbeat of the batch."""
    ledger = build_ledger(pg.store)
    locked, free = [
        (await ledger.begin(ToolCall(workflow_id="wf", tool="t", args={"n": n}))).effect
        for n in range(2)
    ]
    table = sql.Identifier(TEST_SCHEMA, "agent_ledger_effects")
    async with await psycopg.AsyncConnection.connect(DSN) as other, other.transaction():
        await other.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(table), (locked.id,)
        )
        started = time.monotonic()
        outcome = await asyncio.wait_for(
            pg.store.heartbeat([Held(locked.id, 1), Held(free.id, 1)]), 5
        )
        assert time.monotonic() - started < 1.0
    assert outcome == HeartbeatOutcome(
        refreshed=frozenset({Held(free.id, 1)}), busy=frozenset({Held(locked.id, 1)})
    )
    assert await ledger.heartbeat(locked.id, 1)  # the lock is gone: refreshed again


AFTER_MS = 600  # a heartbeat every 200 ms
OPTIONS = RunOptions(stale=StaleOptions(after_ms=AFTER_MS))
HEARTBEAT_QUERY = "WITH held AS%"


async def heartbeat_ages_ms(effect_ids: list[str]) -> list[float]:
    """How long ago each effect's heartbeat landed, by the database clock (a back door)."""
    table = sql.Identifier(TEST_SCHEMA, "agent_ledger_effects")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cursor = await conn.execute(
            sql.SQL(
                "SELECT extract(epoch FROM clock_timestamp() - heartbeat_at) * 1000 FROM {} "
                "WHERE id = ANY(%s::uuid[])"
            ).format(table),
            (effect_ids,),
        )
        return [float(age) for (age,) in await cursor.fetchall()]


async def test_handlers_holding_the_whole_pool_do_not_starve_heartbeats(
    dsn: str, schema: str
) -> None:
    """Every pool connection is taken for three stale windows while three effects run:
    their heartbeats keep landing and a caller of the same keys takes none of them over."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=2, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    store = PostgresStore(pool, schema=schema)
    other = await PostgresStore.connect(dsn, schema=schema, min_size=1, max_size=4)
    ledger = build_ledger(store, defaults=OPTIONS)
    rival = build_ledger(other, defaults=OPTIONS)
    calls = [ToolCall(workflow_id="wf", tool="starve", args={"n": n}) for n in range(3)]
    executions: Counter[str] = Counter()
    running: dict[str, str] = {}
    release = asyncio.Event()

    async def handler(effect: Effect) -> str:
        executions[effect.idem_key] += 1
        running[effect.idem_key] = effect.id
        await release.wait()
        return f"{effect.tool}@{effect.attempt}"

    tasks = [asyncio.create_task(ledger.run(call, handler)) for call in calls]
    try:
        while len(running) < len(calls):
            await asyncio.sleep(0.005)
        # The application takes every connection of the pool, as busy handlers would.
        held = [await pool.getconn() for _ in range(2)]
        ages: list[float] = []
        try:
            tasks += [asyncio.create_task(rival.run(call, handler)) for call in calls]
            for _ in range(6):  # 6 x 0.3 s: three stale windows
                await asyncio.sleep(0.3)
                ages += await heartbeat_ages_ms(list(running.values()))
        finally:
            for conn in held:
                await pool.putconn(conn)
        release.set()
        results = await asyncio.gather(*tasks)
        assert list(executions.values()) == [1, 1, 1], "a live effect was taken over"
        assert results == ["starve@1"] * 6
        assert max(ages) < AFTER_MS, ages
    finally:
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()
        await other.close()
        await pool.close()


async def heartbeat_backends(*, kill: bool = False) -> int:
    """This test run's backends whose last statement was a heartbeat batch (killed if asked)."""
    action = "count(pg_terminate_backend(pid))" if kill else "count(*)"
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cursor = await conn.execute(
            sql.SQL(
                "SELECT {} FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND query LIKE %s "
                "AND application_name = current_setting('application_name')"
            ).format(sql.SQL(action)),
            (HEARTBEAT_QUERY,),
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


async def test_the_heartbeat_connection_comes_back_after_its_backend_is_killed(
    dsn: str, schema: str
) -> None:
    """Its backend is killed every stale window's half while a handler runs: no takeover;
    store.close() closes it."""
    store = await PostgresStore.connect(dsn, schema=schema, min_size=1, max_size=4)
    other = await PostgresStore.connect(dsn, schema=schema, min_size=1, max_size=4)
    ledger = build_ledger(store, defaults=OPTIONS)
    rival = build_ledger(other, defaults=OPTIONS)
    call = ToolCall(workflow_id="wf", tool="reconnect", args={})
    executions = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def handler(effect: Effect) -> int:
        nonlocal executions
        executions += 1
        started.set()
        await release.wait()
        return effect.attempt

    owner = asyncio.create_task(ledger.run(call, handler))
    waiter = None
    try:
        await started.wait()
        waiter = asyncio.create_task(rival.run(call, handler))
        killed = 0
        for _ in range(6):  # 6 x 0.3 s: three stale windows
            await asyncio.sleep(0.3)
            killed += await heartbeat_backends(kill=True)
        assert killed >= 4, "each kill found the reconnected heartbeat connection"
        await asyncio.sleep(0.3)
        assert await heartbeat_backends() == 1
        assert not waiter.done()
        release.set()
        assert await owner == await waiter == 1
        assert executions == 1
        await store.close()
        await asyncio.sleep(0.05)
        assert await heartbeat_backends() == 0, "close() closed the heartbeat connection"
    finally:
        release.set()
        await asyncio.gather(owner, *([waiter] if waiter else []), return_exceptions=True)
        await store.close()
        await other.close()
