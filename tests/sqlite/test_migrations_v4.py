"""Upgrading a real SQLite database written at schema version 3 to version 4
(approval requests, the decision audit trail, used links).

``tests/fixtures/sqlite_schema_v3.sql`` is versions 1 to 3's scripts as
released, byte for byte. A file built from it, with an effect waiting for a
person, is upgraded once; every effect is kept, and the waiting one can then be
decided with its audit row.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from agent_ledger.approvals import Channel, DecisionAction
from agent_ledger.deciding import approval_store, decide, effect_intent
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import SchemaMigration
from agent_ledger.stores.sqlite import SQLITE_MIGRATIONS, SQLITE_SCHEMA_SQL, SqliteStore
from tests.schema_history import SQLITE_V3, executed_sql


def _version_3_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(SQLITE_V3)
        for i, status in enumerate(("succeeded", "requires_approval")):
            conn.execute(
                "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
                " args_canonical, created_us, updated_us, heartbeat_us)"
                " VALUES (?, ?, 'w', 'pay', ?, '{\"cents\":5}', 1, 1, 1)",
                (f"00000000-0000-4000-8000-{i:012d}", f"key-{i}", status),
            )
        conn.commit()


def test_versions_1_to_3_are_never_edited_in_place() -> None:
    released = SQLITE_SCHEMA_SQL + "\n" + SQLITE_MIGRATIONS[2] + SQLITE_MIGRATIONS[3]
    assert executed_sql(released) == executed_sql(SQLITE_V3)


async def test_migrate_adds_the_approval_tables_once_and_keeps_every_effect(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v3.db"
    _version_3_database(db)
    store = SqliteStore(db, create=False)
    try:
        assert await store.migrate() == SchemaMigration(3, 4)
        assert await store.migrate() == SchemaMigration(4, 4)
        assert (await store.stats()).total == 2
        waiting = await store.find("key-1")
        assert waiting is not None and waiting.status is EffectStatus.REQUIRES_APPROVAL
        assert await approval_store(store).approval_request("key-1") is None
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
        await store.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM agent_ledger_schema_version")]
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert sorted(versions) == [1, 2, 3, 4]
    assert {
        "agent_ledger_approvals",
        "agent_ledger_decision_attempts",
        "agent_ledger_used_links",
    } <= tables
