"""A bounded soak: 4 processes x 8 tasks, duplicates, failures and approvals mixed."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_ledger import EffectStatus
from agent_ledger.testing import build_ledger
from tests.reliability.conftest import report
from tests.reliability.soak_worker import call_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PROCESSES, TASKS = 4, 8
CALLS = int(os.environ.get("AGENT_LEDGER_SOAK_CALLS", "2000"))  # per process


async def test_soak(pg: Any, dsn: str, schema: str, tmp_path: Path, rng: random.Random) -> None:
    """Exactly one execution per key, every caller got the recorded outcome, counts add up."""
    url, log, seed = f"{dsn}?schema={schema}", tmp_path / "soak.jsonl", rng.randrange(1 << 20)
    ledger = build_ledger(pg.store)
    started = time.monotonic()
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.soak_worker",
                url,
                str(log),
                str(p),
                str(CALLS),
                str(TASKS),
                str(seed),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
        )
        for p in range(PROCESSES)
    ]
    approvals = 0
    while any(w.poll() is None for w in workers):
        for effect in await ledger.pending_approvals():
            approvals += await ledger.approve(effect.idem_key, by="soak")
        await asyncio.sleep(0.05)
    for w in workers:
        _, err = w.communicate()
        assert w.returncode == 0, err.decode()[-2000:]
    elapsed = time.monotonic() - started

    events = [orjson.loads(line) for line in log.read_text().splitlines()]
    executions = Counter(e["n"] for e in events if e["event"] == "executed")
    outcomes = [e for e in events if e["event"] == "outcome"]
    keys = {e["n"] for e in outcomes}
    assert len(outcomes) == PROCESSES * CALLS
    assert set(executions) == keys and set(executions.values()) == {1}, "one execution per key"
    mismatched = 0
    dedup_total = 0
    for n in keys:
        stored = await ledger.find_by_idem_key(ledger.idem_key(call_for(n)))
        assert stored is not None and stored.status.is_terminal
        dedup_total += stored.dedup_count
        expected_failed = n % 20 == 0
        assert stored.status is (EffectStatus.FAILED if expected_failed else EffectStatus.SUCCEEDED)
        for outcome in (o for o in outcomes if o["n"] == n):
            if ("failed" in outcome) != expected_failed or (
                not expected_failed and outcome["result"] != stored.result
            ):
                mismatched += 1
    stats = await ledger.stats()
    assert stats.total == len(keys)
    assert dedup_total == len(outcomes) - len(keys) == stats.duplicates
    assert mismatched == 0
    report(
        "soak",
        processes=PROCESSES,
        tasks_per_process=TASKS,
        calls=len(outcomes),
        distinct_effects=len(keys),
        duplicates=len(outcomes) - len(keys),
        handler_failures=sum(1 for n in keys if n % 20 == 0),
        approvals=approvals,
        duplicates_executed=sum(c - 1 for c in executions.values()),
        results_mismatched=mismatched,
        seconds=round(elapsed, 1),
        calls_per_second=round(len(outcomes) / elapsed),
    )
