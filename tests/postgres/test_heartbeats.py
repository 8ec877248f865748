"""PostgreSQL heartbeats: one statement per batch that never waits on a locked row."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from psycopg import sql

from agent_ledger import ToolCall
from agent_ledger.stores.base import Held, HeartbeatOutcome
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
