"""Upgrading a real SQLite database written at schema version 1 to today's (version 3).

``tests/fixtures/sqlite_schema_v1.sql`` is the schema as released at version
1, kept byte for byte: the database is built from it, filled with one row per
kind of history a version 1 ledger could leave, and then opened by today's
store, which must upgrade it once, keep every effect, and estimate the new
columns as the migration documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path

import orjson
import pytest

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectStatus,
    EffectStoreError,
    RetryPolicy,
    RunOptions,
    ToolCall,
)
from agent_ledger.options import DEFAULT_STALE_AFTER_MS, StaleOptions
from agent_ledger.stores.base import SchemaMigration
from agent_ledger.stores.memory import MEMORY_SCHEMA_VERSION, MemoryStore
from agent_ledger.stores.sqlite import (
    SQLITE_MIGRATIONS,
    SQLITE_SCHEMA_SQL,
    SQLITE_SCHEMA_VERSION,
    SqliteStore,
)
from agent_ledger.testing import build_ledger
from tests.cli.conftest import Cli
from tests.schema_history import HISTORIES, SQLITE_V1, executed_sql

V1_SCHEMA = SQLITE_V1
SECOND = 1_000_000  # µs
T0 = 1_700_000_000 * SECOND


def _version_1_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(V1_SCHEMA)
        for i, (key, status, attempt, decided, _, _) in enumerate(HISTORIES):
            created = T0 + i * SECOND
            conn.execute(
                "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
                " args_canonical, result, attempt, created_us, updated_us, heartbeat_us,"
                " decided_us, completed_us) VALUES (?, ?, 'w', 't', ?, '{}', ?, ?, ?, ?, ?, ?, ?)",
                (
                    f"00000000-0000-4000-8000-{i:012d}",
                    key,
                    status,
                    '"kept"' if status == "succeeded" else None,
                    attempt,
                    created,
                    created,
                    created,
                    created + SECOND // 2 if decided else None,
                    created + SECOND if status in ("succeeded", "failed", "denied") else None,
                ),
            )
        conn.commit()


def _versions(path: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT version FROM agent_ledger_schema_version ORDER BY 1")
        return [v for (v,) in rows]


def test_version_1_is_never_edited_in_place() -> None:
    """The packaged version 1 script executes exactly the released statements."""
    assert executed_sql(SQLITE_SCHEMA_SQL) == executed_sql(V1_SCHEMA)


def test_every_store_needs_the_same_version() -> None:
    assert SQLITE_SCHEMA_VERSION == MEMORY_SCHEMA_VERSION == 4
    assert set(SQLITE_MIGRATIONS) == {2, 3, 4}


async def test_opening_a_version_1_file_upgrades_it_and_keeps_every_effect(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v1.db"
    _version_1_database(db)
    store = SqliteStore(db)
    try:
        assert await store.check_schema() == 4
        assert _versions(db) == [1, 2, 3, 4]
        by_key = {
            e.idem_key: e for e in (await build_ledger(store).list_effects(limit=100)).effects
        }
        # Version 2's table of 0.2.x keys is there, empty, and maps old effects too.
        assert await store.find_legacy("a" * 64) is None
        assert await store.record_legacy("a" * 64, "ran-once")
        mapped = await store.find_legacy("a" * 64)
        assert mapped is not None and mapped.idem_key == "ran-once"
        assert set(by_key) == {h[0] for h in HISTORIES}, "no effect is lost"
        for i, (key, status, attempt, _, executions, start) in enumerate(HISTORIES):
            effect = by_key[key]
            assert (effect.status.value, effect.attempt) == (status, attempt)
            assert effect.executions == executions, key
            assert effect.lease_ms == DEFAULT_STALE_AFTER_MS
            # Tries were not counted before version 2, and nothing had a history.
            assert (effect.tries, effect.history) == (0, ()), key
            created = T0 + i * SECOND
            expected_start = {None: None, "created": created, "decided": created + SECOND // 2}
            started = effect.started_at
            assert (None if started is None else round(started.timestamp() * SECOND)) == (
                expected_start[start]
            ), key
    finally:
        await store.close()


async def test_an_upgraded_file_keeps_working(tmp_path: Path) -> None:
    """Old receipts replay, a pending approval runs once approved, an old
    holder is judged by the default lease."""
    db = tmp_path / "v1.db"
    _version_1_database(db)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        # Make the old running effect's holder look long dead.
        conn.execute(
            "UPDATE agent_ledger_effects SET idem_key = ?, heartbeat_us = 0 WHERE idem_key = ?",
            (build_ledger(MemoryStore()).idem_key(_call("running")), "running"),
        )
        conn.commit()
    store = SqliteStore(db)
    ledger = build_ledger(store)
    try:
        runs: list[str] = []

        def ran(effect: Effect) -> object:
            runs.append("ran")
            return "new"

        result = await ledger.run(_call("running"), ran)
        assert (result, runs) == ("new", ["ran"])
        effect = await ledger.find_by_idem_key(ledger.idem_key(_call("running")))
        assert effect is not None
        assert (effect.executions, effect.attempt, effect.status) == (2, 2, EffectStatus.SUCCEEDED)
        fresh = await ledger.run(
            _call("fresh"), lambda e: "ok", RunOptions(stale=StaleOptions(after_ms=900))
        )
        assert fresh == "ok"
        stored = await ledger.find_by_idem_key(ledger.idem_key(_call("fresh")))
        assert stored is not None and (stored.executions, stored.lease_ms) == (1, 900)
        await _retried_once(ledger)
    finally:
        await store.close()


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


async def test_a_bare_open_names_the_old_version_and_create_schema_upgrades(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v1.db"
    _version_1_database(db)
    store = SqliteStore(db, create=False)
    try:
        with pytest.raises(EffectStoreError, match=r"version 1, this library needs 4.*migrate"):
            await store.check_schema()
        assert _versions(db) == [1]
        await store.create_schema()
        await store.create_schema()
        assert await store.check_schema() == 4
        assert _versions(db) == [1, 2, 3, 4]
    finally:
        await store.close()


def test_processes_opening_an_old_file_at_once_upgrade_it_once(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
    _version_1_database(db)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_it() -> None:
        try:
            start.wait()
            SqliteStore(db)._executor.shutdown()  # opening is what upgrades
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _versions(db) == [1, 2, 3, 4]


async def test_a_failed_upgrade_rolls_back_and_says_why(tmp_path: Path) -> None:
    """A file the upgrade cannot apply to is left exactly as it was."""
    db = tmp_path / "v1.db"
    _version_1_database(db)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        # Someone added a column of the same name by hand: version 2's second
        # ALTER fails after its first succeeded.
        conn.execute("ALTER TABLE agent_ledger_effects ADD COLUMN executions TEXT")
        conn.commit()
    with pytest.raises(EffectStoreError, match=r"duplicate column name: executions"):
        SqliteStore(db)
    assert _versions(db) == [1]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(agent_ledger_effects)")]
        assert "lease_ms" not in columns, "the first ALTER was rolled back too"
        assert not conn.in_transaction
    # The file is usable by anyone who fixes it by hand.
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("ALTER TABLE agent_ledger_effects DROP COLUMN executions")
        conn.commit()
    store = SqliteStore(db)
    try:
        assert await store.check_schema() == 4
    finally:
        await store.close()


def test_an_upgrade_failing_at_the_legacy_key_table_rolls_back_all_of_it(
    tmp_path: Path,
) -> None:
    """The table is created after the new columns: a failure there undoes them too."""
    db = tmp_path / "v1.db"
    _version_1_database(db)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE agent_ledger_legacy_keys (x INTEGER)")
        conn.commit()
    with pytest.raises(EffectStoreError, match="agent_ledger_legacy_keys already exists"):
        SqliteStore(db)
    assert _versions(db) == [1]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(agent_ledger_effects)")]
        assert "lease_ms" not in columns and "history" not in columns


async def test_migrate_reports_what_it_did_and_is_idempotent(tmp_path: Path) -> None:
    """store.migrate() on a version 1 file: 1 -> 2 once, then 2 -> 2, effects kept."""
    db = tmp_path / "v1.db"
    _version_1_database(db)
    store = SqliteStore(db, create=False)
    try:
        assert await store.migrate() == SchemaMigration(1, 4)
        assert (await store.migrate()).changed is False
        assert await store.check_schema() == 4
        assert _versions(db) == [1, 2, 3, 4]
        assert len((await build_ledger(store).list_effects(limit=100)).effects) == len(HISTORIES)
    finally:
        await store.close()
    fresh = SqliteStore(tmp_path / "new.db")  # opening creates it: nothing left to do
    try:
        assert await fresh.migrate() == SchemaMigration(4, 4)
    finally:
        await fresh.close()
    assert await MemoryStore().migrate() == SchemaMigration(4, 4)


def test_two_migrations_at_once_both_succeed_and_upgrade_once(tmp_path: Path) -> None:
    """Each in its own thread and connection, as two processes would: one reports
    1 -> 2, the other finds 2 already."""
    db = tmp_path / "v1.db"
    _version_1_database(db)
    start = threading.Barrier(2)
    reports: list[SchemaMigration] = []
    errors: list[BaseException] = []

    def migrate() -> None:
        async def run() -> None:
            store = SqliteStore(db, create=False)
            try:
                start.wait()
                reports.append(await store.migrate())
            finally:
                await store.close()

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(reports) == [SchemaMigration(1, 4), SchemaMigration(4, 4)]
    assert _versions(db) == [1, 2, 3, 4]


def test_the_migrate_command_upgrades_a_version_1_file(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
    _version_1_database(db)
    cli = Cli(f"sqlite:///{db}", tmp_path)
    before = cli("list")
    assert before.returncode == 1
    assert "version 1, this library needs 4: run `agent-ledger migrate`" in before.stderr
    done = cli("migrate")
    assert (done.returncode, done.stdout) == (0, "migrated the schema from version 1 to 4\n")
    again = cli("migrate", "--json")
    assert again.returncode == 0
    assert orjson.loads(again.stdout) == {"from_version": 4, "to_version": 4, "changed": False}
    listed = cli("list", "--limit", "100")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(HISTORIES) + 1
    missing = Cli(f"sqlite:///{tmp_path / 'nothing.db'}", tmp_path)("migrate")
    assert missing.returncode == 1 and "agent-ledger init" in missing.stderr
    assert not (tmp_path / "nothing.db").exists()


async def test_a_file_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    """A schema newer than this library's: opening, checking and migrating all refuse it,
    and the file is left as it was."""
    import sqlite3

    from agent_ledger import EffectStoreError, SqliteStore
    from agent_ledger.stores.sqlite import SQLITE_SCHEMA_VERSION

    path = tmp_path / "newer.db"
    store = SqliteStore(path)
    await store.check_schema()
    await store.close()
    newer = SQLITE_SCHEMA_VERSION + 1
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO agent_ledger_schema_version (version, applied_us) VALUES (?, 0)",
            (newer,),
        )
    with pytest.raises(EffectStoreError, match="newer than this library"):
        store = SqliteStore(path)
        await store.check_schema()
    await store.close()
    bare = SqliteStore(path, create=False)
    try:
        with pytest.raises(EffectStoreError, match="newer than this library"):
            await bare.check_schema()
        with pytest.raises(EffectStoreError, match="newer than this library"):
            await bare.migrate()
    finally:
        await bare.close()
    with sqlite3.connect(path) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM agent_ledger_schema_version")]
    assert max(versions) == newer
