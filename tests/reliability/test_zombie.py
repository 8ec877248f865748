"""A zombie worker: frozen past its lease inside its handler, thawed after a takeover.

A worker process (``zombie_worker``) runs the call and is SIGSTOPped as soon
as its handler has started. Another worker (this test) asks for the same
call, finds the effect's lease run out, takes it over and runs the handler
(the second execution, documented: nobody can know whether a frozen worker
did the side effect). Then the zombie gets SIGCONT, either after the taker
finished or while the taker's handler still runs, and carries on as if
nothing happened: its heartbeats and its commit must be fenced off by the
taker's attempt, and its ``run()`` must return the taker's result.

Checked: exactly two executions recorded (the zombie's attempt 1, the
taker's attempt 2), the receipt is the taker's, every heartbeat and commit
the zombie sent after it was thawed was refused, and a zombie thawed after
the taker finished changed nothing in the stored effect.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_ledger import Effect, EffectStatus, SqliteStore
from agent_ledger.stores.base import Store
from agent_ledger.testing import build_ledger
from tests.harness import DSN, TEST_SCHEMA, ensure_test_schema, require_postgres
from tests.reliability.conftest import report
from tests.reliability.zombie_worker import call_for, log, options

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LEASE_MS = 1_000
RESUME = ["after the taker finished", "while the taker runs"]
KINDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_text().splitlines()]


async def wait_for(
    path: Path, found: Callable[[dict[str, Any]], bool], within_s: float, after: int = 0
) -> bool:
    """Wait until a record past the first ``after`` ones satisfies ``found``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if any(found(r) for r in records(path)[after:]):
            return True
        await asyncio.sleep(0.005)
    return False


async def open_stores(kind: str, tmp_path: Path) -> tuple[str, Store]:
    """The zombie's store URL, and the taker's own store on the same data."""
    if kind == "sqlite":
        path = tmp_path / "ledger.db"
        taker = SqliteStore(path)  # creates the file; the real clock, as the worker's
        return f"sqlite:///{path}", taker
    require_postgres()
    await ensure_test_schema()
    from agent_ledger.stores.postgres import PostgresStore

    taker_pg = await PostgresStore.connect(DSN, schema=TEST_SCHEMA, min_size=1, max_size=4)
    return f"{DSN}?schema={TEST_SCHEMA}", taker_pg


@pytest.mark.parametrize("resume", RESUME)
@pytest.mark.parametrize("kind", KINDS)
async def test_zombie_is_fenced_off(kind: str, resume: str, tmp_path: Path) -> None:
    """Two executions (zombie, taker), the taker's receipt, the zombie's writes refused."""
    url, taker_store = await open_stores(kind, tmp_path)
    taker = build_ledger(taker_store, defaults=options(LEASE_MS))
    workflow = f"zombie-{uuid.uuid4().hex[:8]}"
    call = call_for(workflow)
    key = taker.idem_key(call)
    log_path, release = tmp_path / "events.jsonl", tmp_path / "release"
    zombie = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.zombie_worker",
         url, str(log_path), str(release), str(LEASE_MS), workflow],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    thawed_at = 0  # records before this index were logged before SIGCONT
    frozen_for = 0.0
    try:
        assert await wait_for(log_path, lambda r: r["event"] == "executed", 30), "never started"
        os.kill(zombie.pid, signal.SIGSTOP)
        frozen = time.monotonic()

        async def thaw() -> None:
            nonlocal thawed_at, frozen_for
            frozen_for = time.monotonic() - frozen
            log(str(log_path), event="thawed")
            thawed_at = len(records(log_path))
            os.kill(zombie.pid, signal.SIGCONT)
            # Give its overdue heartbeat a moment to go out (and be refused),
            # then let its handler return, and wait for its commit.
            await wait_for(log_path, lambda r: r["event"] == "heartbeat", 2, thawed_at)
            release.touch()
            assert await wait_for(log_path, lambda r: r["event"] == "commit", 10, thawed_at)

        async def taker_handler(effect: Effect) -> dict[str, Any]:
            log(str(log_path), event="executed", who="taker", attempt=effect.attempt)
            if resume == "while the taker runs":
                await thaw()
            return {"by": "taker", "attempt": effect.attempt}

        async with asyncio.timeout(60):
            taker_result = await taker.run(call, taker_handler)
            before_thaw = await taker.find_by_idem_key(key)
            if resume == "after the taker finished":
                await thaw()
            out, err = await asyncio.to_thread(zombie.communicate, timeout=30)
        assert zombie.returncode == 0, err.decode()[-2000:]
        zombie_outcome = orjson.loads(out.decode().strip().splitlines()[-1])
        receipt = await taker.find_by_idem_key(key)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
        await taker_store.close()

    events = records(log_path)
    executed = [(e["who"], e["attempt"]) for e in events if e["event"] == "executed"]
    after_thaw = [e for e in events[thawed_at:] if e["pid"] == zombie.pid]
    heartbeats = [e["alive"] for e in after_thaw if e["event"] == "heartbeat"]
    commits = [e["won"] for e in after_thaw if e["event"] == "commit"]
    report(
        f"zombie worker ({kind}, thawed {resume})",
        lease_ms=LEASE_MS,
        frozen_s=round(frozen_for, 1),
        executions=len(executed),
        executed_by=executed,
        zombie_heartbeats_after_thaw=heartbeats,
        zombie_commits_after_thaw=commits,
        receipt_attempt=receipt.attempt if receipt else None,
        zombie_got_takers_result=zombie_outcome.get("result") == taker_result,
    )
    assert executed == [("zombie", 1), ("taker", 2)]
    assert receipt is not None and receipt.status is EffectStatus.SUCCEEDED
    assert (receipt.attempt, receipt.result) == (2, taker_result)
    assert zombie_outcome == {"result": taker_result}, zombie_outcome
    assert commits == [False], "the zombie's commit must be fenced off"
    assert not any(heartbeats), "a zombie heartbeat was accepted"
    if resume == "after the taker finished":
        assert receipt == before_thaw, "the thawed zombie changed the stored effect"
