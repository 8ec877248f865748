"""Upgrading a real PostgreSQL schema written at version 1 to today's (version 3).

``tests/fixtures/postgres_schema_v1.sql`` is ``schema.sql`` as released at
version 1, byte for byte. A scratch schema is built from it and filled with
one row per kind of history a version 1 ledger could leave; today's
``create_schema()`` (or applying today's ``schema.sql``) must upgrade it
once, keep every effect, and estimate the new columns as documented.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectStatus,
    EffectStoreError,
    RetryPolicy,
    RunOptions,
    ToolCall,
)
from agent_ledger.options import DEFAULT_STALE_AFTER_MS
from agent_ledger.stores.base import SchemaMigration
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.stores.postgres import SCHEMA_SQL, SCHEMA_VERSION, PostgresStore
from agent_ledger.testing import build_ledger
from tests.cli.conftest import Cli
from tests.schema_history import HISTORIES, POSTGRES_V1, executed_sql

V1_SCHEMA = POSTGRES_V1
T0 = datetime(2026, 1, 1, tzinfo=UTC)
HALF = timedelta(milliseconds=500)


def _call(name: str) -> ToolCall:
    return ToolCall(workflow_id="w", tool="t", args={"name": name})


async def _retried_once(ledger: EffectLedger) -> None:
    """A retried run records its failed try in the upgraded table."""
    policy = RetryPolicy(on=ConnectionError, attempts=2, initial_ms=1, jitter=0)
    tries: list[int] = []

    def flaky(effect: Effect) -> object:
        tries.append(effect.tries)
        if len(tries) == 1:
            raise ConnectionError("reset")
        return "ok"

    assert await ledger.run(_call("retried"), flaky, RunOptions(retry=policy)) == "ok"
    effect = await ledger.find_by_idem_key(ledger.idem_key(_call("retried")))
    assert effect is not None and (tries, effect.tries, len(effect.history)) == ([0, 1], 2, 1)


@pytest.fixture
async def v1_schema(dsn: str) -> AsyncIterator[str]:
    """A schema holding a version 1 ledger with every kind of history."""
    name = f"agent_ledger_v1_{uuid.uuid4().hex[:8]}"
    running_key = build_ledger(MemoryStore()).idem_key(_call("running"))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
        await conn.execute(V1_SCHEMA)
        for i, (key, status, attempt, decided, _, _) in enumerate(HISTORIES):
            created = T0 + timedelta(seconds=i)
            await conn.execute(
                "INSERT INTO agent_ledger_effects (idem_key, workflow_id, tool, status,"
                " args_canonical, result, attempt, created_at, updated_at, heartbeat_at,"
                " decided_at, completed_at) VALUES (%s, 'w', 't', %s, '{}', %s, %s, %s, %s,"
                " %s, %s, %s)",
                (
                    running_key if key == "running" else key,
                    status,
                    '"kept"' if status == "succeeded" else None,
                    attempt,
                    created,
                    created,
                    created,  # long ago: the running effect's holder is dead
                    created + HALF if decided else None,
                    created + 2 * HALF if status in ("succeeded", "failed", "denied") else None,
                ),
            )
    yield name
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def _versions(dsn: str, schema: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        table = sql.Identifier(schema, "agent_ledger_schema_version")
        cursor = await conn.execute(sql.SQL("SELECT version FROM {} ORDER BY 1").format(table))
        return [v for (v,) in await cursor.fetchall()]


def test_version_1_is_never_edited_in_place() -> None:
    """schema.sql still executes exactly the released version 1 statements, then
    the later versions' sections."""
    assert executed_sql(SCHEMA_SQL).startswith(executed_sql(V1_SCHEMA) + "\n")
    assert SCHEMA_VERSION == 4


async def test_create_schema_upgrades_a_version_1_schema_and_keeps_every_effect(
    dsn: str, v1_schema: str
) -> None:
    store = await PostgresStore.connect(dsn, schema=v1_schema)
    try:
        with pytest.raises(EffectStoreError, match=r"version 1, this library needs 4"):
            await store.check_schema()
        await store.create_schema()
        await store.create_schema()
        assert await store.check_schema() == 4
        assert await _versions(dsn, v1_schema) == [1, 2, 3, 4]
        ledger = build_ledger(store)
        effects = (await ledger.list_effects(limit=100)).effects
        assert len(effects) == len(HISTORIES), "no effect is lost"
        # Version 2's table of 0.2.x keys is there, empty, and maps old effects too.
        assert await store.find_legacy("a" * 64) is None
        assert await store.record_legacy("a" * 64, "ran-once")
        mapped = await store.find_legacy("a" * 64)
        assert mapped is not None and mapped.idem_key == "ran-once"
        by_key = {e.idem_key: e for e in effects}
        by_key["running"] = by_key.pop(ledger.idem_key(_call("running")))
        for i, (key, status, attempt, _, executions, start) in enumerate(HISTORIES):
            effect = by_key[key]
            assert (effect.status.value, effect.attempt) == (status, attempt)
            assert effect.executions == executions, key
            assert effect.lease_ms == DEFAULT_STALE_AFTER_MS
            # Tries were not counted before version 2, and nothing had a history.
            assert (effect.tries, effect.history) == (0, ()), key
            created = T0 + timedelta(seconds=i)
            expected = {None: None, "created": created, "decided": created + HALF}[start]
            assert effect.started_at == expected, key
            if status == "succeeded":
                assert effect.result == "kept"
        # The old holder is judged by the default lease, and is long dead.
        runs: list[str] = []

        def ran(effect: Effect) -> object:
            runs.append("ran")
            return 7

        assert await ledger.run(_call("running"), ran) == 7
        assert runs == ["ran"]
        taken = await ledger.find_by_idem_key(ledger.idem_key(_call("running")))
        assert taken is not None
        assert (taken.status, taken.attempt, taken.executions) == (EffectStatus.SUCCEEDED, 2, 2)
        await _retried_once(ledger)
    finally:
        await store.close()


async def test_applying_todays_schema_sql_upgrades_too(dsn: str, v1_schema: str) -> None:
    """What psql users do: apply the file again (twice: the second is a no-op)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(v1_schema)))
        await conn.execute(SCHEMA_SQL)
        await conn.execute(SCHEMA_SQL)
    assert await _versions(dsn, v1_schema) == [1, 2, 3, 4]
    store = await PostgresStore.connect(dsn, schema=v1_schema)
    try:
        assert await store.check_schema() == 4
        assert await build_ledger(store).run(_call("fresh"), lambda e: "ok") == "ok"
    finally:
        await store.close()


async def test_concurrent_create_schema_on_a_version_1_schema_upgrades_once(
    dsn: str, v1_schema: str
) -> None:
    stores = [await PostgresStore.connect(dsn, schema=v1_schema) for _ in range(3)]
    try:
        await asyncio.gather(*(s.create_schema() for s in stores))
        assert await _versions(dsn, v1_schema) == [1, 2, 3, 4]
    finally:
        for store in stores:
            await store.close()


async def test_migrate_reports_what_it_did(dsn: str, v1_schema: str) -> None:
    """1 -> 2 once, then 2 -> 2; a schema that did not exist is created (0 -> 2)."""
    store = await PostgresStore.connect(dsn, schema=v1_schema)
    try:
        assert await store.migrate() == SchemaMigration(1, 4)
        assert await store.migrate() == SchemaMigration(4, 4)
        assert await _versions(dsn, v1_schema) == [1, 2, 3, 4]
        assert len((await build_ledger(store).list_effects(limit=100)).effects) == len(HISTORIES)
    finally:
        await store.close()
    fresh = f"{v1_schema}_new"
    store = await PostgresStore.connect(dsn, schema=fresh)
    try:
        assert await store.migrate() == SchemaMigration(0, 4)
        assert await store.check_schema() == 4
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(fresh)))


async def test_concurrent_migrations_both_succeed_and_upgrade_once(
    dsn: str, v1_schema: str
) -> None:
    stores = [await PostgresStore.connect(dsn, schema=v1_schema) for _ in range(3)]
    try:
        reports = await asyncio.gather(*(s.migrate() for s in stores))
        assert sorted(reports) == [SchemaMigration(1, 4)] + [SchemaMigration(4, 4)] * 2
        assert await _versions(dsn, v1_schema) == [1, 2, 3, 4]
    finally:
        for store in stores:
            await store.close()


async def test_a_failed_migration_leaves_the_schema_as_it_was(dsn: str, v1_schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # Someone added a column of a version 2 name by hand.
        table = sql.Identifier(v1_schema, "agent_ledger_effects")
        await conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN tries text").format(table))
    store = await PostgresStore.connect(dsn, schema=v1_schema)
    try:
        with pytest.raises(EffectStoreError, match='column "tries"') as failed:
            await store.migrate()
        assert failed.value.operation == "migrate"
        assert await _versions(dsn, v1_schema) == [1]
        with pytest.raises(EffectStoreError, match="version 1"):
            await store.check_schema()
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = 'agent_ledger_effects'",
            (v1_schema,),
        )
        columns = {name for (name,) in await cursor.fetchall()}
    assert "lease_ms" not in columns, "the whole version was rolled back"


async def test_a_migration_failing_at_the_legacy_key_table_rolls_back_all_of_version_2(
    dsn: str, v1_schema: str
) -> None:
    """The table is created after the new columns: a failure there undoes them too."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        legacy = sql.Identifier(v1_schema, "agent_ledger_legacy_keys")
        await conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(legacy))
    store = await PostgresStore.connect(dsn, schema=v1_schema)
    try:
        with pytest.raises(EffectStoreError, match="agent_ledger_legacy_keys"):
            await store.migrate()
        assert await _versions(dsn, v1_schema) == [1]
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = 'agent_ledger_effects'",
            (v1_schema,),
        )
        columns = {name for (name,) in await cursor.fetchall()}
    assert "lease_ms" not in columns, "the whole version was rolled back"


def test_the_migrate_command_upgrades_a_version_1_schema(
    dsn: str, v1_schema: str, tmp_path: Path
) -> None:
    cli = Cli(f"{dsn}?schema={v1_schema}", tmp_path)
    before = cli("pending")
    assert before.returncode == 1 and "run `agent-ledger migrate`" in before.stderr
    done = cli("migrate")
    assert (done.returncode, done.stdout) == (0, "migrated the schema from version 1 to 4\n")
    again = cli("migrate")
    assert (again.returncode, again.stdout) == (0, "schema already at version 4: nothing to do\n")
    assert cli("pending").returncode == 0


async def test_a_schema_from_a_newer_release_is_refused(dsn: str) -> None:
    """Checking and migrating a schema a newer release migrated both refuse it."""
    name = f"agent_ledger_newer_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.connect(dsn, schema=name, min_size=1, max_size=2)
    try:
        await store.create_schema()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(
                    sql.Identifier(name, "agent_ledger_schema_version")
                ),
                (SCHEMA_VERSION + 1,),
            )
        with pytest.raises(EffectStoreError, match="newer than this library"):
            await store.check_schema()
        with pytest.raises(EffectStoreError, match="newer than this library"):
            await store.migrate()
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
