"""After a retryable failure, processes calling at once run the handler exactly once more."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_ledger import EffectStatus
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.testing import build_ledger
from tests.processes import executions, finish, spawn
from tests.worker import CALL

pytestmark = pytest.mark.slow


async def test_processes_after_a_retryable_failure_run_it_once_more(tmp_path: Path) -> None:
    """One process fails retryably; then four processes call at once: one runs attempt
    2, the others get its result; the log shows exactly two executions."""
    db, log = tmp_path / "ledger.db", tmp_path / "executions.log"
    url = f"sqlite:///{db}"
    SqliteStore(db)
    first = finish(spawn(url, "run", "--log", str(log), "--retryable"))
    assert first["error"] == "ConnectionError"
    start_at = str(time.time() + 3.0)
    workers = [
        spawn(
            url, "run", "--log", str(log), "--retryable", "--sleep", "0.3", "--start-at", start_at
        )
        for _ in range(4)
    ]
    outcomes = [finish(w) for w in workers]
    assert [attempt for _, attempt in executions(log)] == [1, 2]
    assert all(o["result"]["attempt"] == 2 for o in outcomes)
    store = SqliteStore(db)
    try:
        effect = await store.find(build_ledger(store).idem_key(CALL))
        assert effect is not None
        assert (effect.status, effect.attempt, effect.executions) == (EffectStatus.SUCCEEDED, 2, 2)
    finally:
        await store.close()
