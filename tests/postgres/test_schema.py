"""schema.sql: one source of truth, idempotent, mirroring the enum, versioned."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from agent_ledger import EffectLedgerValidationError, EffectStatus, EffectStoreError, ToolCall
from agent_ledger.stores.postgres import SCHEMA_SQL, SCHEMA_VERSION, PostgresStore
from agent_ledger.testing import build_ledger
from tests.harness import PostgresHarness

ROOT_SCHEMA = Path(__file__).resolve().parents[2] / "schema.sql"


@pytest.fixture
async def scratch_schema(dsn: str) -> AsyncIterator[str]:
    name = f"agent_ledger_scratch_{uuid.uuid4().hex[:8]}"
    yield name
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_root_schema_sql_is_the_packaged_text() -> None:
    """The repo's schema.sql and SCHEMA_SQL are the same text, so they cannot drift."""
    assert ROOT_SCHEMA.read_text(encoding="utf-8") == SCHEMA_SQL


async def test_schema_sql_applies_twice_verbatim(dsn: str, scratch_schema: str) -> None:
    """`conn.execute(SCHEMA_SQL)` works as documented, and a second time is a no-op."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(scratch_schema)))
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(scratch_schema)))
        await conn.execute(SCHEMA_SQL)
        await conn.execute(SCHEMA_SQL)
        cursor = await conn.execute("SELECT version FROM agent_ledger_schema_version")
        # Every version, in order: the file creates version 1 and upgrades it.
        assert await cursor.fetchall() == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    store = await PostgresStore.connect(dsn, schema=scratch_schema)
    try:
        assert await store.check_schema() == SCHEMA_VERSION
        assert await build_ledger(store).run(ToolCall(workflow_id="w", tool="t"), lambda e: 1) == 1
    finally:
        await store.close()


async def test_create_schema_is_idempotent_and_concurrent_safe(
    dsn: str, scratch_schema: str
) -> None:
    """Several workers calling create_schema() at start-up all succeed."""
    import asyncio

    stores = [await PostgresStore.connect(dsn, schema=scratch_schema) for _ in range(3)]
    try:
        await asyncio.gather(*(s.create_schema() for s in stores))
        await stores[0].create_schema()
        assert await stores[0].check_schema() == SCHEMA_VERSION
    finally:
        for s in stores:
            await s.close()


async def test_status_check_constraint_mirrors_the_enum(
    pg: PostgresHarness, dsn: str, schema: str
) -> None:
    """The CHECK constraint allows exactly the EffectStatus values."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c "
            "JOIN pg_namespace n ON n.oid = c.connamespace "
            "WHERE n.nspname = %s AND c.conname = 'agent_ledger_effects_status_check'",
            (schema,),
        )
        row = await cursor.fetchone()
    assert row is not None
    allowed = set(__import__("re").findall(r"'(\w+)'::text", row[0]))
    assert allowed == {s.value for s in EffectStatus}


async def test_database_rejects_an_unknown_status(
    pg: PostgresHarness, dsn: str, schema: str
) -> None:
    """A hand-written bad status is refused by the database itself."""
    ledger = build_ledger(pg.store)
    begun = await ledger.begin(ToolCall(workflow_id="w", tool="t"))
    with pytest.raises(psycopg.errors.CheckViolation):
        await pg._sql(
            sql.SQL("UPDATE {} SET status = 'paused' WHERE id = %s").format(pg._table()),
            begun.effect.id,
        )


async def test_missing_tables_give_a_clear_store_error(dsn: str, scratch_schema: str) -> None:
    """Using a schema without the tables says what to apply, with the operation and key."""
    store = await PostgresStore.connect(dsn, schema=scratch_schema)
    try:
        ledger = build_ledger(store)
        call = ToolCall(workflow_id="w", tool="t")
        # The ledger checks the schema first (one clear line before any step)...
        with pytest.raises(EffectStoreError, match=r"apply schema\.sql") as info:
            await ledger.run(call, lambda e: 1)
        assert info.value.operation == "check_schema"
        # ...and a store step on its own names its operation and key.
        with pytest.raises(EffectStoreError, match=r"apply schema\.sql") as info:
            await store.begin(ledger._engine.prepare(call, None, None).new)
        assert info.value.operation == "begin"
        assert info.value.idem_key == ledger.idem_key(call)
        assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
        with pytest.raises(
            EffectStoreError, match=r"tables are missing .* apply schema\.sql"
        ) as info:
            await store.check_schema()
        # It names the command that fixes it, for this database and schema (issue 30):
        # run as written, it creates the tables.
        found = re.search(r"`agent-ledger init --url '([^']+)'`", str(info.value))
        assert found is not None, str(info.value)
        assert f"schema={scratch_schema}" in found.group(1)
        script = Path(sys.executable).with_name("agent-ledger")
        done = subprocess.run(
            [str(script), "init", "--url", found.group(1)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert await store.check_schema() == SCHEMA_VERSION
    finally:
        await store.close()


async def test_hostile_schema_names_are_quoted_not_executed(dsn: str) -> None:
    """A schema name full of SQL is only ever an identifier."""
    name = 'x"; DROP TABLE pg_class; --'
    store = await PostgresStore.connect(dsn, schema=name)
    try:
        await store.create_schema()
        ledger = build_ledger(store)
        assert await ledger.run(ToolCall(workflow_id="w", tool="t"), lambda e: "safe") == "safe"
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.parametrize("name", ["", "x" * 64, None])
def test_invalid_schema_names_are_rejected(name: object) -> None:
    """Empty, over-long or non-string schema names fail at construction."""
    with pytest.raises(EffectLedgerValidationError, match="schema"):
        PostgresStore(None, schema=name)  # type: ignore[arg-type]


async def test_unreachable_server_is_a_store_error() -> None:
    """connect() to a port nobody listens on raises EffectStoreError naming the step."""
    with pytest.raises(EffectStoreError) as info:
        await PostgresStore.connect(
            "postgresql://postgres@127.0.0.1:1/test", min_size=1, connect_timeout=1.0
        )
    assert info.value.operation == "connect"


async def test_the_ledger_checks_the_schema_version_on_first_use(
    dsn: str, scratch_schema: str
) -> None:
    """A missing or older schema fails the ledger's first call with both versions named,
    and nothing is written (issue 10, item 15)."""
    store = await PostgresStore.connect(dsn, schema=scratch_schema)
    try:
        ledger = build_ledger(store)
        call = ToolCall(workflow_id="wf", tool="t", args={})
        with pytest.raises(EffectStoreError, match=r"tables are missing") as missing:
            await ledger.run(call, lambda e: "ran")
        assert missing.value.operation == "check_schema"
        await store.create_schema()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            versions = sql.Identifier(scratch_schema, "agent_ledger_schema_version")
            await conn.execute(sql.SQL("DELETE FROM {}").format(versions))
            await conn.execute(sql.SQL("INSERT INTO {} (version) VALUES (0)").format(versions))
        older = build_ledger(store)  # a fresh ledger checks again
        with pytest.raises(
            EffectStoreError, match=rf"version 0, this library needs {SCHEMA_VERSION}"
        ) as info:
            await older.approve("f" * 64)
        assert info.value.operation == "check_schema"
        assert (await store.stats()).total == 0
    finally:
        await store.close()


async def test_recovery_reads_only_open_sagas_even_with_a_generic_plan(
    dsn: str, scratch_schema: str
) -> None:
    """`claimable_sagas` runs often, as a prepared statement: its generic plan must
    use the partial index of open sagas, not read every saga ever finished."""
    from agent_ledger.stores import _postgres_queries as q

    store = await PostgresStore.connect(dsn, schema=scratch_schema)
    try:
        await store.create_schema()
    finally:
        await store.close()
    text = q.SAGA_CLAIMABLE.replace("{sagas}", "agent_ledger_sagas")
    for name, number in (("after_at", 1), ("after_id", 2), ("limit", 3)):
        text = text.replace(f"%({name})s", f"${number}")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(scratch_schema)))
        await conn.execute(
            "INSERT INTO agent_ledger_sagas (saga_id, status, lease_ms, heartbeat_at,"
            " created_at, updated_at, completed_at) SELECT 's' || g, 'completed', 15000,"
            " now(), now(), now(), now() FROM generate_series(1, 20000) g"
        )
        await conn.execute("ANALYZE agent_ledger_sagas")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE claimable (timestamptz, text, int) AS {text}")
        cursor = await conn.execute("EXPLAIN EXECUTE claimable (NULL, NULL, 100)")
        plan = "\n".join(line for (line,) in await cursor.fetchall())
    assert "agent_ledger_sagas_open_idx" in plan, plan
