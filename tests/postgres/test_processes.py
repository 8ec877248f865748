"""Several OS processes on one database: one execution, takeover after a kill, wake-ups."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_ledger import EffectDeniedError, EffectStatus, RunOptions
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.testing import build_ledger
from tests.processes import executions, finish
from tests.processes import spawn as spawn_worker
from tests.worker import CALL


def spawn(dsn: str, schema: str, mode: str, *args: str) -> subprocess.Popen[str]:
    return spawn_worker(f"{dsn}?schema={schema}", mode, *args)


async def test_processes_racing_on_one_call_execute_once(
    pg: Any, dsn: str, schema: str, tmp_path: Path
) -> None:
    """Six processes start the same call at the same instant: one handler run, one result."""
    log = tmp_path / "executions.log"
    start_at = str(time.time() + 3.0)
    workers = [
        spawn(dsn, schema, "run", "--log", str(log), "--sleep", "0.3", "--start-at", start_at)
        for _ in range(6)
    ]
    outcomes = [await asyncio.to_thread(finish, w) for w in workers]
    assert len(executions(log)) == 1
    assert {orjson.dumps(o).decode() for o in outcomes} == {orjson.dumps(outcomes[0]).decode()}
    effect = await build_ledger(pg.store).find_by_idem_key(build_ledger(pg.store).idem_key(CALL))
    assert (
        effect is not None and effect.dedup_count == 5 and effect.status is EffectStatus.SUCCEEDED
    )


async def test_killed_worker_is_taken_over_by_another_process(
    pg: Any, dsn: str, schema: str, tmp_path: Path
) -> None:
    """SIGKILL mid-handler; another process claims the effect after after_ms and completes it."""
    log = tmp_path / "executions.log"
    victim = spawn(dsn, schema, "run", "--log", str(log), "--sleep", "600", "--after-ms", "1000")
    for _ in range(600):
        if executions(log):
            break
        await asyncio.sleep(0.05)
    assert executions(log) == [(victim.pid, 1)]
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=10)
    assert victim.returncode == -signal.SIGKILL

    started = time.monotonic()
    taker = spawn(dsn, schema, "run", "--log", str(log), "--after-ms", "1000")
    outcome = await asyncio.to_thread(finish, taker)
    assert outcome == {"result": {"pid": taker.pid, "attempt": 2}}
    assert time.monotonic() - started < 30
    assert executions(log) == [(victim.pid, 1), (taker.pid, 2)]
    ledger = build_ledger(pg.store)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.status, effect.attempt) == (EffectStatus.SUCCEEDED, 2)


SLOW_POLL = ConcurrencyOptions(initial_interval_ms=30_000, max_interval_ms=30_000, jitter_factor=0)


async def wait_for_status(pg: Any, status: EffectStatus) -> None:
    ledger = build_ledger(pg.store)
    for _ in range(500):
        effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
        if effect is not None and effect.status is status:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never reached {status}")


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_decision_from_another_process_wakes_the_waiter(
    pg: Any, dsn: str, schema: str, decision: str
) -> None:
    """approve/deny in another process wakes run() at once, although it polls every 30 s."""
    ledger = build_ledger(pg.store)
    options = RunOptions(requires_approval=True, concurrency=SLOW_POLL)
    waiting = asyncio.create_task(ledger.run(CALL, lambda e: "deployed", options))
    await wait_for_status(pg, EffectStatus.REQUIRES_APPROVAL)
    decider = spawn(dsn, schema, decision, "--idem-key", ledger.idem_key(CALL))
    assert await asyncio.to_thread(finish, decider) is True
    decided_at = time.monotonic()
    if decision == "approve":
        assert await asyncio.wait_for(waiting, 5) == "deployed"
    else:
        with pytest.raises(EffectDeniedError):
            await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - decided_at < 2.0
