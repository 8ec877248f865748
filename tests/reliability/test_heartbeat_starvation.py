"""Heartbeat starvation: handlers hold every connection of the pool the ledger uses.

The application gives ``PostgresStore`` its own ``AsyncConnectionPool``, and
its handlers use that pool too. Here every handler takes a connection and
keeps it for longer than the lease, so for that long the pool has nothing
left for anyone else. Another worker (its own pool, as on another machine)
meanwhile asks for the same calls and would take over any effect whose
heartbeats stopped. The owners are alive throughout: none of their effects
may be taken over, so every key runs once and the receipts are the owners'.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from agent_ledger import Effect, RunOptions, ToolCall
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger
from tests.reliability.conftest import report

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
POOL = 4
LEASE_MS = 1_000
#: How long each handler keeps its connection: well past the lease.
HOLD_S = 2.5 * LEASE_MS / 1000
OPTIONS = RunOptions(
    stale=StaleOptions(after_ms=LEASE_MS),
    concurrency=ConcurrencyOptions(
        wait_timeout_ms=20_000, initial_interval_ms=20, max_interval_ms=200
    ),
)


async def test_handlers_holding_the_pool_do_not_starve_heartbeats(dsn: str, schema: str) -> None:
    """POOL handlers hold all POOL connections for 2.5 leases: no live effect taken over."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=POOL, max_size=POOL, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True, timeout=30)
    store = PostgresStore(pool, schema=schema)
    elsewhere = await PostgresStore.connect(dsn, schema=schema, min_size=1, max_size=POOL)
    owner, other = build_ledger(store, defaults=OPTIONS), build_ledger(elsewhere, defaults=OPTIONS)
    workflow = f"starve-{uuid.uuid4().hex[:8]}"
    calls = [
        ToolCall(workflow_id=workflow, tool="report.build", args={"i": i}) for i in range(POOL)
    ]
    executions: Counter[int] = Counter()
    ran_by: dict[int, list[str]] = {}
    running, holding, most_held = 0, 0, 0
    all_running = asyncio.Event()

    async def owner_handler(effect: Effect, i: int) -> dict[str, Any]:
        nonlocal running, holding, most_held
        executions[i] += 1
        ran_by.setdefault(i, []).append(f"owner#{effect.attempt}")
        running += 1
        if running == POOL:
            all_running.set()  # every begin is done: the pool is the handlers' now
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")  # the application's own query
            holding += 1
            most_held = max(most_held, holding)
            await asyncio.sleep(HOLD_S)
            holding -= 1
        return {"i": i, "by": "owner"}

    async def other_handler(effect: Effect, i: int) -> dict[str, Any]:
        executions[i] += 1
        ran_by.setdefault(i, []).append(f"other#{effect.attempt}")
        return {"i": i, "by": "other"}

    async def duplicate(i: int) -> Any:
        await all_running.wait()
        return await other.run(calls[i], functools.partial(other_handler, i=i))

    started = time.monotonic()
    try:
        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(
                *(owner.run(calls[i], functools.partial(owner_handler, i=i)) for i in range(POOL)),
                *(duplicate(i) for i in range(POOL)),
                return_exceptions=True,
            )
            receipts = [await other.find_by_idem_key(other.idem_key(c)) for c in calls]
    finally:
        await store.close()
        await elsewhere.close()
        await pool.close()
    errors = Counter(type(o).__name__ for o in outcomes if isinstance(o, BaseException))
    taken_over = sorted(i for i in range(POOL) if executions[i] > 1)
    report(
        "heartbeat starvation (handlers hold the whole pool)",
        pool=POOL,
        lease_ms=LEASE_MS,
        held_s=HOLD_S,
        connections_held_at_once=most_held,
        executions_per_key=[executions[i] for i in range(POOL)],
        ran_by=[ran_by.get(i) for i in range(POOL)],
        live_effects_taken_over=len(taken_over),
        errors_seen=dict(errors),
        seconds=round(time.monotonic() - started, 1),
    )
    assert taken_over == [], f"live effects taken over: {[ran_by[i] for i in taken_over]}"
    assert not errors, dict(errors)
    assert all(
        r is not None and r.result == {"i": i, "by": "owner"} for i, r in enumerate(receipts)
    )
    assert outcomes == [{"i": i % POOL, "by": "owner"} for i in range(2 * POOL)]
