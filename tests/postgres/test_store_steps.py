"""PostgresStore's steps called directly: honest error labels."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from agent_ledger import EffectStatus, EffectStoreError
from agent_ledger.stores.postgres import PostgresStore


@pytest.fixture
async def empty_schema(dsn: str) -> AsyncIterator[str]:
    name = f"agent_ledger_empty_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def test_store_errors_name_the_step_not_the_target(dsn: str, empty_schema: str) -> None:
    """A failing transition reports operation="transition", whatever the target."""
    store = await PostgresStore.connect(dsn, schema=empty_schema)
    try:
        for target in (EffectStatus.READY, EffectStatus.CANCELED):
            with pytest.raises(EffectStoreError) as info:
                await store.transition("k" * 64, target=target)
            assert info.value.operation == "transition"
            assert info.value.idem_key == "k" * 64
    finally:
        await store.close()
