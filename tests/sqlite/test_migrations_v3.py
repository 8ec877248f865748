"""Upgrading a real SQLite database written at schema version 2 to version 3 (sagas,
the effects' usage column, budgets, and the ambiguous-attempt columns).

``tests/fixtures/sqlite_schema_v2.sql`` is version 1 and version 2's script
as they stand, byte for byte. A file is built from it with effects in it;
today's store must add the saga tables once, keep every effect, and leave a
file it cannot upgrade as it was.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from agent_ledger import Budget, EffectStoreError, LLMResult, RunOptions, ToolCall, Usage
from agent_ledger.stores.base import SchemaMigration
from agent_ledger.stores.saga_base import NewSaga, NewSagaStep, SagaStatus
from agent_ledger.stores.sqlite import SQLITE_MIGRATIONS, SQLITE_SCHEMA_SQL, SqliteStore
from agent_ledger.testing import build_ledger
from tests.schema_history import SQLITE_V2, executed_sql


def _version_2_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(SQLITE_V2)
        for i in range(3):
            conn.execute(
                "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
                " args_canonical, result, created_us, updated_us, heartbeat_us, executions,"
                " tries) VALUES (?, ?, 'w', 't', 'succeeded', '{}', '\"kept\"', 1, 1, 1, 1, 1)",
                (f"00000000-0000-4000-8000-{i:012d}", f"key-{i}"),
            )
        conn.commit()


def _versions(path: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [v for (v,) in conn.execute("SELECT version FROM agent_ledger_schema_version")]


def _tables(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_versions_1_and_2_are_never_edited_in_place() -> None:
    assert executed_sql(SQLITE_SCHEMA_SQL + "\n" + SQLITE_MIGRATIONS[2]) == executed_sql(SQLITE_V2)


async def test_opening_a_version_2_file_adds_the_saga_tables_and_keeps_every_effect(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v2.db"
    _version_2_database(db)
    bare = SqliteStore(db, create=False)
    try:
        with pytest.raises(EffectStoreError, match=r"version 2, this library needs 4.*migrate"):
            await bare.check_schema()
        assert await bare.migrate() == SchemaMigration(2, 4)
        assert await bare.migrate() == SchemaMigration(4, 4)
    finally:
        await bare.close()
    assert sorted(_versions(db)) == [1, 2, 3, 4]
    assert {
        "agent_ledger_budgets",
        "agent_ledger_budget_holds",
        "agent_ledger_budget_charges",
    } <= _tables(db)
    store = SqliteStore(db)
    try:
        ledger = build_ledger(store)
        effects = (await ledger.list_effects(limit=10)).effects
        assert sorted(e.idem_key for e in effects) == ["key-0", "key-1", "key-2"]
        assert all(e.result == "kept" for e in effects)
        assert all(e.usage is None for e in effects), "rows from version 2 cost nothing"
        assert await ledger.run(ToolCall(workflow_id="w", tool="t"), lambda e: 1) == 1
        # The usage column: a model call's usage lands beside its result.
        async with ledger.workflow("w"):
            reply = await ledger.llm(
                lambda request: LLMResult({"ok": True}, Usage(7, 3)),
                provider="p",
                model="m",
                request={},
                pricing=lambda p, m, u: 0.25,
                estimate=Usage(7, 3),
            )
        assert reply.usage == Usage(7, 3, 0.25)
        # The budget tables.
        async with ledger.workflow("w", budget=Budget(usd=1.0)):
            await ledger.run(ToolCall(workflow_id="w", tool="t", args={"n": 2}), lambda e: 2)
        state = await ledger.budget("w")
        assert state is not None and state.limits == Budget(usd=1.0)
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
        await store.close()


async def test_a_failed_version_3_leaves_the_file_at_version_2(tmp_path: Path) -> None:
    """The steps table comes after the sagas table: a failure there undoes both."""
    db = tmp_path / "v2.db"
    _version_2_database(db)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE agent_ledger_saga_steps (x INTEGER)")
        conn.commit()
    with pytest.raises(EffectStoreError, match="agent_ledger_saga_steps"):
        SqliteStore(db)
    assert sorted(_versions(db)) == [1, 2]
    assert "agent_ledger_sagas" not in _tables(db), "the whole version was rolled back"
