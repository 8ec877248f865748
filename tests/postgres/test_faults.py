"""Broken connections: a clear error or a transparent retry, never a lost or doubled effect."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from agent_ledger import Effect, EffectStatus, ToolCall
from agent_ledger.testing import build_ledger

REPO = Path(__file__).resolve().parents[2]


async def kill_other_backends(dsn: str) -> int:
    """Terminate this test run's other backends (same application_name) in this database."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' "
            "AND application_name = current_setting('application_name')"
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


async def test_connection_killed_during_the_handler_still_records_once(pg: Any, dsn: str) -> None:
    """The pool's connections die while the handler runs; the commit is retried and lands."""
    ledger = build_ledger(pg.store)
    call = ToolCall(workflow_id="wf", tool="charge", args={"n": 1})
    executions = 0

    async def charge(effect: Effect) -> str:
        nonlocal executions
        executions += 1
        assert await kill_other_backends(dsn) >= 1
        return "ch_1"

    assert await ledger.run(call, charge) == "ch_1"
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None and (effect.status, effect.result) == (EffectStatus.SUCCEEDED, "ch_1")
    assert await ledger.run(call, charge) == "ch_1"
    assert executions == 1


def run_pytest(env_overrides: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, **env_overrides}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
         "tests/postgres/test_schema.py", "-k", "applies_twice"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_without_a_server_postgres_tests_skip_with_a_reason() -> None:
    """An unreachable DSN skips the Postgres tests with a one-line reason."""
    done = run_pytest(
        {
            "AGENT_LEDGER_TEST_DSN": "postgresql://postgres@127.0.0.1:1/test",
            "AGENT_LEDGER_REQUIRE_POSTGRES": "0",
        }
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout and "PostgreSQL not reachable" in done.stdout


def test_require_flag_turns_the_skip_into_a_failure() -> None:
    """With AGENT_LEDGER_REQUIRE_POSTGRES=1 the same run fails loudly."""
    done = run_pytest(
        {
            "AGENT_LEDGER_TEST_DSN": "postgresql://postgres@127.0.0.1:1/test",
            "AGENT_LEDGER_REQUIRE_POSTGRES": "1",
        }
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "AGENT_LEDGER_REQUIRE_POSTGRES=1 but PostgreSQL not reachable" in done.stdout


async def test_dead_pooled_connections_are_replaced_without_errors(dsn: str, schema: str) -> None:
    """After every idle pooled connection is killed, the next steps still succeed."""
    from agent_ledger.stores.postgres import PostgresStore

    # This run's own name (tests set PGAPPNAME per process): never another run's backends.
    app = f"{os.environ.get('PGAPPNAME', 'agent_ledger_tests')}_dead_pool"
    store = await PostgresStore.connect(
        f"{dsn}?application_name={app}", schema=schema, min_size=4, max_size=4
    )
    try:
        ledger = build_ledger(store)
        await asyncio.gather(*(ledger.find_by_idem_key("0" * 64) for _ in range(8)))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (app,),
            )
            row = await cursor.fetchone()
            assert row is not None and row[0] >= 1
        call = ToolCall(workflow_id="wf", tool="after.kill", args={})
        assert await ledger.run(call, lambda e: "ok") == "ok"
        assert await ledger.run(call, lambda e: "again") == "ok"
    finally:
        await store.close()


async def kill_backends_named(dsn: str, application_name: str) -> int:
    """Terminate the backends whose application_name is ``application_name``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


@pytest.mark.parametrize("autocommit", [False, True], ids=["default-pool", "autocommit-pool"])
async def test_killed_idle_connections_are_replaced_on_any_pool(
    dsn: str, schema: str, autocommit: bool
) -> None:
    """On a pool the application built, with default kwargs or autocommit, run() succeeds
    after the pool's idle connections were killed (issue 10, item 10)."""
    from agent_ledger.stores.postgres import PostgresStore

    # This run's own name (conftest sets PGAPPNAME per run), narrowed to this pool.
    app = f"{os.environ['PGAPPNAME']}_pool"
    kwargs: dict[str, Any] = {"application_name": app}
    if autocommit:
        kwargs["autocommit"] = True
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=4, max_size=4, kwargs=kwargs, open=False
    )
    await pool.open(wait=True)
    store = PostgresStore(pool, schema=schema)
    try:
        ledger = build_ledger(store)
        await asyncio.gather(*(ledger.find_by_idem_key("0" * 64) for _ in range(8)))
        assert await kill_backends_named(dsn, app) >= 1
        call = ToolCall(workflow_id="wf", tool="after.kill", args={"autocommit": autocommit})
        assert await ledger.run(call, lambda e: "ok") == "ok"
        assert await ledger.run(call, lambda e: "again") == "ok"
        async with pool.connection() as conn:
            # Handed back to the application as it configured the pool.
            assert conn.autocommit is autocommit
    finally:
        await store.close()
        await pool.close()
