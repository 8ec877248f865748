"""SqliteStore beyond the contract: processes, restarts, and clear errors."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import cast

import pytest

from agent_ledger import EffectLedgerValidationError, EffectStatus, EffectStoreError, ToolCall
from agent_ledger.stores.sqlite import SQLITE_SCHEMA_SQL, SqliteStore
from agent_ledger.testing import build_ledger
from tests.processes import executions, finish
from tests.processes import spawn as spawn_worker
from tests.worker import CALL


def spawn(db: Path, mode: str, *args: str) -> subprocess.Popen[str]:
    return spawn_worker(f"sqlite:///{db}", mode, *args)


async def test_processes_racing_on_one_file_execute_once(tmp_path: Path) -> None:
    """Six processes start the same call at once on one SQLite file: one execution."""
    db, log = tmp_path / "ledger.db", tmp_path / "executions.log"
    SqliteStore(db)  # create the schema up front, as `agent-ledger init` would
    start_at = str(time.time() + 3.0)
    workers = [
        spawn(db, "run", "--log", str(log), "--sleep", "0.3", "--start-at", start_at)
        for _ in range(6)
    ]
    outcomes = [await asyncio.to_thread(finish, w) for w in workers]
    assert len(executions(log)) == 1
    assert all(o == outcomes[0] for o in outcomes)
    store = SqliteStore(db)
    try:
        effect = await store.find(build_ledger(store).idem_key(CALL))
        assert effect is not None and (effect.status, effect.dedup_count) == (
            EffectStatus.SUCCEEDED,
            5,
        )
    finally:
        await store.close()


async def test_killed_process_is_taken_over(tmp_path: Path) -> None:
    """SIGKILL mid-handler; another process claims the effect after after_ms."""
    db, log = tmp_path / "ledger.db", tmp_path / "executions.log"
    victim = spawn(db, "run", "--log", str(log), "--sleep", "600", "--after-ms", "1000")
    for _ in range(600):
        if executions(log):
            break
        await asyncio.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=10)
    taker = spawn(db, "run", "--log", str(log), "--after-ms", "1000")
    assert await asyncio.to_thread(finish, taker) == {"result": {"pid": taker.pid, "attempt": 2}}
    assert executions(log) == [(victim.pid, 1), (taker.pid, 2)]


async def test_receipts_survive_a_restart(tmp_path: Path) -> None:
    """Close the store, open the file again: the same receipt replays, nothing re-runs."""
    db = tmp_path / "ledger.db"
    call = ToolCall(workflow_id="w", tool="email.send", args={"to": "ada@example.com"})
    first = SqliteStore(db)
    assert await build_ledger(first).run(call, lambda e: {"sent": True}) == {"sent": True}
    before = await first.find(build_ledger(first).idem_key(call))
    await first.close()
    second = SqliteStore(db)
    try:
        ledger = build_ledger(second)
        replayed = await ledger.run(call, lambda e: {"sent": "again"})
        assert cast(object, replayed) == {"sent": True}
        after = await second.find(ledger.idem_key(call))
        assert before is not None and after is not None
        assert after.id == before.id and after.completed_at == before.completed_at
        assert after.dedup_count == before.dedup_count + 1
    finally:
        await second.close()


async def test_opening_without_create_gives_clear_errors(tmp_path: Path) -> None:
    """create=False: a missing file or a file without tables says to run init."""
    with pytest.raises(EffectStoreError, match=r"no ledger database at .*agent-ledger init"):
        SqliteStore(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    sqlite3.connect(tmp_path / "empty.db").close()
    with pytest.raises(EffectStoreError, match=r"no agent-ledger tables.*agent-ledger init"):
        SqliteStore(tmp_path / "empty.db", create=False)


@pytest.mark.parametrize("path", ["", ":memory:"])
def test_in_memory_paths_are_refused(path: str) -> None:
    """SQLite's own :memory: would not be shared or durable: use MemoryStore."""
    with pytest.raises(EffectLedgerValidationError, match="MemoryStore"):
        SqliteStore(path)


def test_status_check_constraint_mirrors_the_enum() -> None:
    """The SQLite schema's CHECK constraint lists exactly the EffectStatus values."""
    block = re.search(r"CHECK \(status IN \((.*?)\)\)", SQLITE_SCHEMA_SQL, flags=re.S)
    assert block is not None
    assert set(re.findall(r"'(\w+)'", block.group(1))) == {s.value for s in EffectStatus}


async def test_wal_mode_and_full_sync_by_default(tmp_path: Path) -> None:
    """The file is in WAL mode and the store syncs fully unless told otherwise."""
    store = SqliteStore(tmp_path / "ledger.db")
    try:
        with sqlite3.connect(tmp_path / "ledger.db") as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        sync = await asyncio.get_running_loop().run_in_executor(
            store._executor, lambda: store._conn.execute("PRAGMA synchronous").fetchone()[0]
        )
        assert sync == 2  # FULL
    finally:
        await store.close()


async def test_recovery_reads_only_open_sagas(tmp_path: Path) -> None:
    """`claimable_sagas` searches the partial index of open sagas, not every saga."""
    from agent_ledger.stores import _sqlite_queries as q

    path = tmp_path / "plan.db"
    store = SqliteStore(path)
    await store.create_schema()
    await store.close()
    conn = sqlite3.connect(path)
    try:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN " + q.SAGA_CLAIMABLE,
            {"now": 0, "after_us": None, "after_id": None, "limit": 10},
        ).fetchall()
    finally:
        conn.close()
    assert any("agent_ledger_sagas_open_idx" in str(row[3]) for row in plan), plan
