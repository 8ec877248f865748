"""PostgresStore behind PgBouncer in transaction mode: what needs a session, and what does not.

The whole contract suite runs through PgBouncer in the slow tier (the
``pgbouncer`` harness kind in tests/harness.py); these are the quick checks
of the fast tier: the pooler is detected, no statement is prepared on a
server connection the next transaction may not get, a pool that does
prepare is told how to fix it, and waiters are woken by notifications with
a direct ``listen_dsn`` and by their polls without one (both measured).
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from agent_ledger import EffectLedger, EffectStoreError, ToolCall
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger
from tests.harness import DSN, require_pgbouncer
from tests.pgbouncer import pgbouncer_for

ROOT = Path(__file__).resolve().parents[2]


async def test_connect_through_pgbouncer_detects_it_and_never_prepares(schema: str) -> None:
    """Each store step through PgBouncer, with another client taking the server
    connection the step used last: a prepared statement would be missing there."""
    with pgbouncer_for(DSN, pool_size=2) as bouncer:
        store = await PostgresStore.connect(bouncer.dsn, schema=schema, max_size=1)
        other = await psycopg.AsyncConnection.connect(bouncer.dsn, autocommit=True)
        try:
            kwargs = store._pool.kwargs
            assert isinstance(kwargs, dict) and kwargs["prepare_threshold"] is None
            ledger = build_ledger(store)
            for i in range(12):  # past psycopg's default prepare_threshold (5)
                call = ToolCall(workflow_id="pooled", tool="t", args={"i": i % 3})
                async with other.transaction():
                    # Holds the server connection the store's last step ran on
                    # (PgBouncer hands out the most recently used one first).
                    await other.execute("SELECT 1")
                    assert await ledger.run(call, lambda e: {"ok": True}) == {"ok": True}
            assert (await store.stats()).total == 3
        finally:
            await other.close()
            await store.close()


async def test_a_pool_that_prepares_behind_pgbouncer_is_told_to_set_prepare_threshold(
    schema: str,
) -> None:
    with pgbouncer_for(DSN, pool_size=2) as bouncer:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            bouncer.dsn,
            min_size=1,
            max_size=1,
            kwargs={"autocommit": True, "prepare_threshold": 0},  # prepare at once
            open=False,
        )
        await pool.open(wait=True)
        store = PostgresStore(pool, schema=schema)
        other = await psycopg.AsyncConnection.connect(bouncer.dsn, autocommit=True)
        try:
            await store.find("k1")  # prepared on the server connection it got
            async with other.transaction():
                await other.execute("SELECT 1")  # now holds that connection
                with pytest.raises(EffectStoreError, match="prepare_threshold"):
                    await store.find("k1")
        finally:
            await other.close()
            await store.close()
            await pool.close()


async def _wake_delay(ledger: EffectLedger, call: ToolCall) -> float:
    """Seconds from a holder's commit returning to a waiter on the same key returning."""
    release = asyncio.Event()

    async def hold(effect: object) -> dict[str, int]:
        await release.wait()
        return {"n": 1}

    async def holder() -> float:
        await ledger.run(call, hold)
        return time.monotonic()

    holding = asyncio.create_task(holder())
    await asyncio.sleep(0.2)  # the holder owns the effect
    waiting = asyncio.create_task(ledger.run(call, hold))
    await asyncio.sleep(2.0)  # the waiter's polls are a second apart by now
    release.set()
    committed = await holding
    assert await waiting == {"n": 1}
    return time.monotonic() - committed


async def _wake_delays(store: PostgresStore, rounds: int, workflow_id: str) -> list[float]:
    ledger = build_ledger(store)
    return [
        await _wake_delay(ledger, ToolCall(workflow_id=workflow_id, tool="t", args={"n": n}))
        for n in range(rounds)
    ]


@pytest.mark.slow
async def test_waiters_behind_a_pooler_poll_without_listen_dsn_and_are_notified_with_it(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The measured wake delay of a waiter, behind PgBouncer, with and without a
    direct listener (figures in docs/postgres.md, "Behind a pooler")."""
    bouncer = require_pgbouncer()
    with caplog.at_level(logging.WARNING, logger="agent_ledger"):
        polling = await PostgresStore.connect(bouncer, schema=schema)
        try:
            polled = await _wake_delays(polling, 3, "polled")
            assert polling._listener.polling_only
        finally:
            await polling.close()
    assert any("listen_dsn" in r.getMessage() for r in caplog.records), caplog.text
    listening = await PostgresStore.connect(bouncer, schema=schema, listen_dsn=DSN)
    try:
        notified = await _wake_delays(listening, 3, "notified")
        assert not listening._listener.polling_only
    finally:
        await listening.close()
    print(f"wake delay behind PgBouncer: polled {polled}, notified {notified}")
    # Polling: within the poll schedule's cap (1 s, +30 % jitter), and then some
    # for a loaded machine. Notified: well under the polls' cap.
    assert max(polled) < 2.0
    assert statistics.median(notified) < 0.3
    assert statistics.median(notified) < statistics.median(polled)


async def test_listen_dsn_must_be_a_connection_string(schema: str) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(DSN, open=False)
    with pytest.raises(Exception, match="listen_dsn") as raised:
        PostgresStore(pool, schema=schema, listen_dsn="  ")
    assert getattr(raised.value, "field", None) == "listen_dsn"


def test_the_pooler_snippet_of_the_postgres_page_runs_through_pgbouncer(tmp_path: Path) -> None:
    from tests.test_docs import _blocks, _docs_schema

    bouncer = require_pgbouncer()
    (snippet,) = [b for b in _blocks(ROOT / "docs" / "postgres.md", "python") if "POOLER_URL" in b]
    script = tmp_path / "pooler.py"
    script.write_text(snippet)
    with _docs_schema():
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "DATABASE_URL": DSN, "POOLER_URL": bouncer},
        )
    assert done.returncode == 0, done.stderr
    assert "{'charge': 'ch_1'}" in done.stdout, done.stdout
