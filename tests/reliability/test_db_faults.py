"""Database faults under load: killed connections, an exhausted pool, a server restart.

Expected: each caller gets its result or a clear EffectStoreError, waiters
still wake, and after a recovery pass nothing is stuck in processing, no
committed result is lost, and only calls whose outcome could not be recorded
ran twice (once before the fault, once when taken over).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
from collections import Counter
from typing import Any

import psycopg
import pytest

from agent_ledger import (
    Effect,
    EffectLedgerError,
    EffectStatus,
    EffectStoreError,
    RunOptions,
    ToolCall,
)
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger
from tests.reliability.conftest import report

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
#: This run's own application_name (conftest sets PGAPPNAME per run and xdist worker),
#: narrowed to the chaos pool: the faults never reach another run's backends.
APP = f"{os.environ.get('PGAPPNAME', 'agent_ledger_tests')}_chaos"
OPTIONS = RunOptions(
    stale=StaleOptions(after_ms=300),
    concurrency=ConcurrencyOptions(
        wait_timeout_ms=20_000, initial_interval_ms=20, max_interval_ms=200
    ),
)


async def terminate_app_backends(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (APP,),
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


class Load:
    """Runs calls (with duplicates) and records what each caller saw and ran."""

    def __init__(self, store: PostgresStore, tag: str, handler_s: float = 0.01) -> None:
        self.ledger = build_ledger(store, defaults=OPTIONS)
        self.tag = tag
        self.handler_s = handler_s
        self.executions: Counter[int] = Counter()
        self.results: dict[int, list[Any]] = {}
        self.store_errors: Counter[int] = Counter()

    def call(self, i: int) -> ToolCall:
        return ToolCall(workflow_id=f"chaos-{self.tag}", tool="side.effect", args={"i": i})

    async def one(self, i: int) -> None:
        async def handler(effect: Effect) -> dict[str, int]:
            self.executions[i] += 1
            # Every tenth handler outlives a heartbeat interval (after_ms / 3 =
            # 100 ms), so faults also land on heartbeats.
            await asyncio.sleep(0.25 if i % 10 == 0 else self.handler_s)
            return {"i": i}

        try:
            self.results.setdefault(i, []).append(
                await self.ledger.run(self.call(i), handler, OPTIONS)
            )
        except EffectStoreError:
            self.store_errors[i] += 1

    async def run(self, keys: list[int], tasks: int) -> None:
        queue = list(keys)

        async def worker() -> None:
            while queue:
                await self.one(queue.pop())

        await asyncio.gather(*(worker() for _ in range(tasks)))

    async def recover(self, n: int, rounds: int = 5) -> int:
        """Retry every call until it has a terminal receipt, as an agent would; return
        how many store errors the retries still met (a dead pooled connection fails
        once before the pool replaces it)."""
        errors_before = sum(self.store_errors.values())
        for _ in range(rounds):
            await self.run(list(range(n)), 8)
            missing = [
                i
                for i in range(n)
                if (e := await self.ledger.find_by_idem_key(self.ledger.idem_key(self.call(i))))
                is None
                or not e.status.is_terminal
            ]
            if not missing:
                break
        return sum(self.store_errors.values()) - errors_before

    async def check(self, n: int) -> dict[str, int]:
        stuck, mismatched = 0, 0
        for i in range(n):
            effect = await self.ledger.find_by_idem_key(self.ledger.idem_key(self.call(i)))
            if effect is None or effect.status is not EffectStatus.SUCCEEDED:
                stuck += 1
                continue
            mismatched += sum(1 for r in self.results.get(i, []) if r != effect.result)
        twice = [i for i, c in self.executions.items() if c > 1]
        # Two executions are allowed only where a caller was told the store failed.
        unexplained = [i for i in twice if self.store_errors[i] == 0]
        assert (stuck, mismatched, unexplained) == (0, 0, [])
        assert max(self.executions.values()) <= 2
        return {
            "effects_lost": stuck,
            "results_mismatched": mismatched,
            "executed_twice_after_store_error": len(twice),
            "duplicates_executed": len(unexplained),
        }


async def chaos_store(dsn: str, schema: str, max_size: int = 10) -> PostgresStore:
    return await PostgresStore.connect(
        f"{dsn}?application_name={APP}", schema=schema, min_size=1, max_size=max_size
    )


async def test_connections_killed_during_load(dsn: str, schema: str, rng: random.Random) -> None:
    """pg_terminate_backend every 100 ms hits begin, commit, heartbeats (every tenth
    handler runs 250 ms, past a heartbeat) and the listener."""
    store = await chaos_store(dsn, schema)
    load = Load(store, f"kill-{rng.randrange(1 << 30)}")
    n = 300
    keys = [rng.randrange(n) for _ in range(n + n // 5)]  # every key once, some twice
    keys = list(range(n)) + keys[: n // 5]
    rng.shuffle(keys)
    killed = 0
    stop = asyncio.Event()

    async def chaos() -> None:
        nonlocal killed
        while not stop.is_set():
            await asyncio.sleep(0.1)
            killed += await terminate_app_backends(dsn)

    try:
        chaos_task = asyncio.create_task(chaos())
        await load.run(keys, 16)
        stop.set()
        await chaos_task
        errors_during_chaos = sum(load.store_errors.values())
        errors_recovering = await load.recover(n)
        figures = await load.check(n)
    finally:
        await store.close()
    assert killed > 0
    report(
        "connections killed under load",
        calls=len(keys),
        backends_terminated=killed,
        store_errors_seen=errors_during_chaos,
        store_errors_while_recovering=errors_recovering,
        **figures,
    )


async def test_more_waiters_than_connections(dsn: str, schema: str) -> None:
    """A 3-connection pool serves 40 duplicate waiters and 40 other calls at once."""
    store = await chaos_store(dsn, schema, max_size=3)
    load = Load(store, f"pool-{os.getpid()}-{random.randrange(1 << 30)}")
    try:
        await load.run([0] * 40 + list(range(1, 41)), 80)
        figures = await load.check(41)
    finally:
        await store.close()
    assert sum(load.store_errors.values()) == 0
    assert load.executions[0] == 1 and load.results[0] == [{"i": 0}] * 40
    report("pool exhausted (3 connections, 80 callers)", calls=80, **figures)


def restart_server() -> None:
    version = os.listdir("/etc/postgresql")[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


async def server_started_at(dsn: str) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute("SELECT pg_postmaster_start_time()")
        row = await cursor.fetchone()
        return row[0] if row else None


async def test_server_restart_mid_load(dsn: str, schema: str, rng: random.Random) -> None:
    """The server restarts while calls run; afterwards everything is recorded once.

    It restarts whatever server AGENT_LEDGER_TEST_DSN points at, so it runs only
    when AGENT_LEDGER_TEST_RESTART_SERVER=1 says that is fine (.ci/run sets it).
    """
    if os.environ.get("AGENT_LEDGER_TEST_RESTART_SERVER") != "1":
        pytest.skip("restarts the PostgreSQL server: set AGENT_LEDGER_TEST_RESTART_SERVER=1")
    if not os.path.isdir("/etc/postgresql") or os.geteuid() != 0:
        pytest.skip("restarting the server needs a local cluster and root")
    store = await chaos_store(dsn, schema)
    load = Load(store, f"restart-{rng.randrange(1 << 30)}", handler_s=0.05)
    n = 400  # 400 calls x 50 ms over 8 tasks: about 2.5 s of load
    before = await server_started_at(dsn)
    try:
        running = asyncio.create_task(load.run(list(range(n)), 8))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(restart_server)
        assert not running.done(), "the restart must land while calls are running"
        with contextlib.suppress(EffectLedgerError):
            await running
        errors_during_restart = sum(load.store_errors.values())
        await load.recover(n)
        figures = await load.check(n)
    finally:
        await store.close()
    assert await server_started_at(dsn) > before
    report("server restarted mid-load", calls=n, store_errors_seen=errors_during_restart, **figures)
