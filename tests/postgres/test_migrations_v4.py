"""Upgrading a real PostgreSQL schema written at version 3 to version 4 (approval
requests, the decision audit trail, used links).

``tests/fixtures/postgres_schema_v3.sql`` is ``schema.sql`` as released at
version 3, byte for byte; today's file must execute it unchanged and then add
version 4's section once, however many stores migrate at the same time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from agent_ledger.approvals import Channel, DecisionAction
from agent_ledger.deciding import approval_store, decide, effect_intent
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import SchemaMigration
from agent_ledger.stores.postgres import SCHEMA_SQL, PostgresStore
from tests.schema_history import POSTGRES_V3, executed_sql


@pytest.fixture
async def v3_schema(dsn: str) -> AsyncIterator[str]:
    name = f"agent_ledger_v3_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
        await conn.execute(POSTGRES_V3)
        for i, status in enumerate(("succeeded", "requires_approval")):
            await conn.execute(
                "INSERT INTO agent_ledger_effects (idem_key, workflow_id, tool, status,"
                " args_canonical) VALUES (%s, 'w', 'pay', %s, '{\"cents\":5}')",
                (f"key-{i}", status),
            )
    yield name
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_version_3_is_never_edited_in_place() -> None:
    assert executed_sql(SCHEMA_SQL).startswith(executed_sql(POSTGRES_V3) + "\n")


async def test_migrate_adds_version_4_once_and_keeps_every_effect(dsn: str, v3_schema: str) -> None:
    stores = [await PostgresStore.connect(dsn, schema=v3_schema) for _ in range(3)]
    try:
        reports = await asyncio.gather(*(s.migrate() for s in stores))
        assert sorted(reports) == [SchemaMigration(3, 4)] + [SchemaMigration(4, 4)] * 2
        store = stores[0]
        assert (await store.stats()).total == 2
        waiting = await store.find("key-1")
        assert waiting is not None and waiting.status is EffectStatus.REQUIRES_APPROVAL
        done = await decide(
            store,
            "key-1",
            action=DecisionAction.APPROVE,
            principal="alice",
            channel=Channel.CONSOLE,
            shown_intent=effect_intent(waiting, None),
        )
        assert done.accepted
        (row,) = await approval_store(store).decision_attempts("key-1")
        assert row.principal == "alice"
    finally:
        for s in stores:
            await s.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        table = sql.Identifier(v3_schema, "agent_ledger_schema_version")
        cursor = await conn.execute(sql.SQL("SELECT version FROM {} ORDER BY 1").format(table))
        assert [v for (v,) in await cursor.fetchall()] == [1, 2, 3, 4]
