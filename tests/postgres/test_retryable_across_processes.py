"""PostgreSQL: after a retryable failure, processes calling at once run it exactly once more."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agent_ledger import EffectStatus
from agent_ledger.testing import build_ledger
from tests.processes import executions, finish
from tests.processes import spawn as spawn_worker
from tests.worker import CALL

pytestmark = pytest.mark.slow


def spawn(dsn: str, schema: str, *args: str) -> subprocess.Popen[str]:
    return spawn_worker(f"{dsn}?schema={schema}", "run", "--retryable", *args)


async def test_processes_after_a_retryable_failure_run_it_once_more(
    pg: Any, dsn: str, schema: str, tmp_path: Path
) -> None:
    """One process fails retryably; four then call at the same instant: the row lock
    and the attempt fence let exactly one run attempt 2, and all four get its result."""
    log = tmp_path / "executions.log"
    first = await asyncio.to_thread(finish, spawn(dsn, schema, "--log", str(log)))
    assert first["error"] == "ConnectionError"
    start_at = str(time.time() + 3.0)
    workers = [
        spawn(dsn, schema, "--log", str(log), "--sleep", "0.3", "--start-at", start_at)
        for _ in range(4)
    ]
    outcomes = [await asyncio.to_thread(finish, w) for w in workers]
    assert [attempt for _, attempt in executions(log)] == [1, 2]
    assert all(o["result"]["attempt"] == 2 for o in outcomes)
    ledger = build_ledger(pg.store)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None
    assert (effect.status, effect.attempt, effect.executions) == (EffectStatus.SUCCEEDED, 2, 2)
