"""Upgrading a real PostgreSQL schema written at version 2 to version 3 (sagas, and the
ambiguous-attempt columns).

``tests/fixtures/postgres_schema_v2.sql`` is ``schema.sql`` as it stood at
version 2, byte for byte; today's file must execute it unchanged and then
add version 3's section once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from agent_ledger import Budget, EffectStoreError, LLMResult, RunOptions, ToolCall, Usage
from agent_ledger.stores.base import SchemaMigration
from agent_ledger.stores.postgres import SCHEMA_SQL, PostgresStore
from agent_ledger.stores.saga_base import NewSaga, NewSagaStep, SagaStatus
from agent_ledger.testing import build_ledger
from tests.schema_history import POSTGRES_V2, executed_sql


@pytest.fixture
async def v2_schema(dsn: str) -> AsyncIterator[str]:
    name = f"agent_ledger_v2_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
        await conn.execute(POSTGRES_V2)
        for i in range(3):
            await conn.execute(
                "INSERT INTO agent_ledger_effects (idem_key, workflow_id, tool, status,"
                " args_canonical, result, executions, tries)"
                " VALUES (%s, 'w', 't', 'succeeded', '{}', '\"kept\"', 1, 1)",
                (f"key-{i}",),
            )
    yield name
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def _versions(dsn: str, schema: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        table = sql.Identifier(schema, "agent_ledger_schema_version")
        cursor = await conn.execute(sql.SQL("SELECT version FROM {} ORDER BY 1").format(table))
        return [v for (v,) in await cursor.fetchall()]


def test_version_2_is_never_edited_in_place() -> None:
    assert executed_sql(SCHEMA_SQL).startswith(executed_sql(POSTGRES_V2) + "\n")


async def test_migrate_adds_the_saga_tables_once_and_keeps_every_effect(
    dsn: str, v2_schema: str
) -> None:
    stores = [await PostgresStore.connect(dsn, schema=v2_schema) for _ in range(3)]
    try:
        with pytest.raises(EffectStoreError, match=r"version 2, this library needs 4"):
            await stores[0].check_schema()
        reports = await asyncio.gather(*(s.migrate() for s in stores))
        assert sorted(reports) == [SchemaMigration(2, 4)] + [SchemaMigration(4, 4)] * 2
        assert await _versions(dsn, v2_schema) == [1, 2, 3, 4]
        store = stores[0]
        ledger = build_ledger(store)
        effects = (await ledger.list_effects(limit=10)).effects
        assert sorted(e.idem_key for e in effects) == ["key-0", "key-1", "key-2"]
        assert all(e.usage is None for e in effects), "rows from version 2 cost nothing"
        assert await ledger.run(ToolCall(workflow_id="w", tool="t"), lambda e: 1) == 1
        async with ledger.workflow("w", budget=Budget(usd=1.0)):
            reply = await ledger.llm(
                lambda request: LLMResult({"ok": True}, Usage(7, 3)),
                provider="p",
                model="m",
                request={},
                pricing=lambda p, m, u: 0.25,
                estimate=Usage(7, 3),
            )
        assert reply.usage == Usage(7, 3, 0.25)
        assert (await ledger.find_by_idem_key(reply.effect.idem_key)) == reply.effect
        state = await ledger.budget("w")
        assert state is not None and state.spent.usd == 0.25
        # Version 3's effect columns: none recorded before it; a park run records both.
        assert all(e.park_attempt is None and e.worker is None for e in effects)
        pay = ToolCall(workflow_id="w", tool="pay")
        await ledger.begin(pay, run_options=RunOptions(on_stale="park"))
        recorded = await ledger.find_by_idem_key(ledger.idem_key(pay))
        assert recorded is not None and recorded.park_attempt == 1 and recorded.worker
        began = await store.begin_saga(NewSaga("s", None, 1000, None, "continue"))
        assert began.created and began.saga.status is SagaStatus.RUNNING
        step = NewSagaStep(0, 0, "t", "key-0", None, None, "succeeded")
        assert await store.record_step("s", attempt=1, step=step) is not None
    finally:
        for s in stores:
            await s.close()


async def test_the_usage_column_and_budget_tables_are_added(dsn: str, v2_schema: str) -> None:
    store = await PostgresStore.connect(dsn, schema=v2_schema)
    try:
        await store.migrate()
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = %s"
            " AND table_name = 'agent_ledger_effects' AND column_name = 'usage'",
            (v2_schema,),
        )
        assert await cursor.fetchone() == ("json",)
        cursor = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
            " AND table_name LIKE 'agent_ledger_budget%%' ORDER BY 1",
            (v2_schema,),
        )
        assert [name for (name,) in await cursor.fetchall()] == [
            "agent_ledger_budget_charges",
            "agent_ledger_budget_holds",
            "agent_ledger_budgets",
        ]


async def test_applying_todays_schema_sql_to_version_2_upgrades_it(
    dsn: str, v2_schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(v2_schema)))
        await conn.execute(SCHEMA_SQL)
        await conn.execute(SCHEMA_SQL)
    assert await _versions(dsn, v2_schema) == [1, 2, 3, 4]


async def test_a_failed_version_3_leaves_the_schema_at_version_2(dsn: str, v2_schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        steps = sql.Identifier(v2_schema, "agent_ledger_saga_steps")
        await conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(steps))
    store = await PostgresStore.connect(dsn, schema=v2_schema)
    try:
        with pytest.raises(EffectStoreError, match="agent_ledger_saga_steps"):
            await store.migrate()
        assert await _versions(dsn, v2_schema) == [1, 2]
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = 'agent_ledger_sagas'",
            (v2_schema,),
        )
        assert await cursor.fetchone() == (0,), "the whole version was rolled back"


async def test_version_3_adds_five_tables_and_three_columns_and_rewrites_no_row(
    dsn: str, v2_schema: str
) -> None:
    """What docs/postgres.md says version 3 changes, and that the upgrade keeps the
    effects table's storage (no rewrite: quick on any table size)."""

    async def catalog(
        conn: psycopg.AsyncConnection[tuple[object, ...]],
    ) -> tuple[int, set[str], set[str]]:
        node = await conn.execute(
            "SELECT relfilenode FROM pg_class WHERE oid = %s::regclass",
            (f'"{v2_schema}".agent_ledger_effects',),
        )
        tables = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (v2_schema,),
        )
        columns = await conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = 'agent_ledger_effects'",
            (v2_schema,),
        )
        (filenode,) = await node.fetchone() or (0,)
        return (
            int(str(filenode)),
            {str(t) for (t,) in await tables.fetchall()},
            {str(c) for (c,) in await columns.fetchall()},
        )

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        before = await catalog(conn)
        store = await PostgresStore.connect(dsn, schema=v2_schema)
        try:
            assert await store.migrate() == SchemaMigration(2, 4)
        finally:
            await store.close()
        after = await catalog(conn)
        assert after[1] - before[1] == {
            "agent_ledger_sagas",
            "agent_ledger_saga_steps",
            "agent_ledger_budgets",
            "agent_ledger_budget_holds",
            "agent_ledger_budget_charges",
            # Version 4's, applied by the same migrate(): tables only.
            "agent_ledger_approvals",
            "agent_ledger_decision_attempts",
            "agent_ledger_used_links",
        }
        assert after[2] - before[2] == {"usage", "park_attempt", "worker"}
        assert after[0] == before[0], "the effects table was rewritten"
        rows = await conn.execute(
            sql.SQL("SELECT usage, park_attempt, worker FROM {}").format(
                sql.Identifier(v2_schema, "agent_ledger_effects")
            )
        )
        assert await rows.fetchall() == [(None, None, None)] * 3
