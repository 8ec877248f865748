"""Eight processes racing on the same keys: each key runs once, everyone gets its receipt."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from agent_ledger import EffectStatus
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness
from tests.reliability.conftest import report
from tests.reliability.race_worker import call_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PROCESSES, KEYS = 8, 40


async def test_eight_processes_racing_on_the_same_keys(
    sql_server: tuple[StoreHarness, str], tmp_path: Path
) -> None:
    """Every process runs every key, all at once, each in its own order: zero
    duplicate executions, zero lost effects, one receipt per key for all."""
    harness, url = sql_server
    log = tmp_path / "events.jsonl"
    start_at = str(time.time() + 3.0)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.race_worker",
                url,
                str(log),
                str(KEYS),
                str(seed),
                start_at,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for seed in range(PROCESSES)
    ]
    for worker in workers:
        _, err = await asyncio.to_thread(worker.communicate, timeout=300)
        assert worker.returncode == 0, err.decode()[-2000:]

    events = [orjson.loads(line) for line in log.read_text().splitlines()]
    executions = Counter(e["i"] for e in events if e["event"] == "executed")
    ledger = build_ledger(harness.store)
    await harness.store.flush_counts()
    stored = {i: await ledger.find_by_idem_key(ledger.idem_key(call_for(i))) for i in range(KEYS)}
    lost = [i for i, effect in stored.items() if effect is None or not effect.status.is_terminal]
    assert lost == []
    assert all(e is not None and e.status is EffectStatus.SUCCEEDED for e in stored.values())
    duplicates = {i: n for i, n in executions.items() if n != 1}
    assert duplicates == {}
    assert sorted(executions) == list(range(KEYS))
    returned = [e for e in events if e["event"] == "returned"]
    assert len(returned) == PROCESSES * KEYS
    mismatched = [e for e in returned if stored[e["i"]].result != e["result"]]  # type: ignore[union-attr]
    assert mismatched == []
    # Duplicate counts are statistics, written in batches: never high. (Exact on
    # MariaDB here; PostgreSQL was seen one short per key, a count lost when a
    # worker closed: reported, not pinned by this test.)
    counted = {i: e.dedup_count for i, e in stored.items() if e is not None}
    assert max(counted.values()) <= PROCESSES - 1
    report(
        f"{PROCESSES} processes racing on the same keys ({harness.kind})",
        processes=PROCESSES,
        keys=KEYS,
        calls=PROCESSES * KEYS,
        handler_executions=sum(executions.values()),
        duplicates_executed=len(duplicates),
        effects_lost=len(lost),
        results_mismatched=len(mismatched),
        duplicates_counted=sum(counted.values()),
    )
