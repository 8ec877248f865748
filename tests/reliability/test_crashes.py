"""Worker processes SIGKILLed at random points of run(): nothing lost, nothing run thrice."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from agent_ledger import EffectStatus
from agent_ledger.effects import Parked
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness
from tests.reliability.conftest import report
from tests.reliability.crash_worker import call_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
WORKERS, SLICE, AFTER_MS = 6, 20, 500


def worker(url: str, log: Path, first: int, crash_at: int, point: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.crash_worker", url, str(log), str(first),
         str(SLICE if crash_at >= 0 else WORKERS * SLICE), str(crash_at), point, str(AFTER_MS)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


async def test_sigkill_at_random_points(
    sql_server: tuple[StoreHarness, str], tmp_path: Path, rng: random.Random
) -> None:
    """Every effect ends terminal; only crashed calls ran twice; callers saw the receipts."""
    pg, url = sql_server
    log = tmp_path / "events.jsonl"
    crashes: dict[int, str] = {}
    victims = []
    for w in range(WORKERS):
        first = w * SLICE
        crash_at = first + rng.randrange(SLICE)
        crashes[crash_at] = rng.choice(["before", "inside", "commit"])
        victims.append(worker(url, log, first, crash_at, crashes[crash_at]))
    for victim in victims:
        _, err = await asyncio.to_thread(victim.communicate, timeout=120)
        assert victim.returncode == -9, err.decode()[-2000:]

    recovery = worker(url, log, 0, -1, "none")
    _, err = await asyncio.to_thread(recovery.communicate, timeout=300)
    assert recovery.returncode == 0, err.decode()[-2000:]

    events = [orjson.loads(line) for line in log.read_text().splitlines()]
    executions = Counter(e["i"] for e in events if e["event"] == "executed")
    ledger = build_ledger(pg.store)
    stored = {
        i: await ledger.find_by_idem_key(ledger.idem_key(call_for(i)))
        for i in range(WORKERS * SLICE)
    }
    lost = [i for i, effect in stored.items() if effect is None or not effect.status.is_terminal]
    assert lost == []
    assert all(
        effect is not None and effect.status is EffectStatus.SUCCEEDED for effect in stored.values()
    )
    for i, count in executions.items():
        ran_before_crash = crashes.get(i) in ("inside", "commit")
        assert count == (2 if ran_before_crash else 1), (i, crashes.get(i), count)
    for i, point in crashes.items():
        effect = stored[i]
        assert effect is not None and effect.attempt == 2, (i, point)  # taken over
    returned = [e for e in events if e["event"] == "returned"]
    mismatched = [e for e in returned if stored[e["i"]].result != e["result"]]  # type: ignore[union-attr]
    assert mismatched == []
    report(
        f"process crashes (SIGKILL, {pg.kind})",
        calls=WORKERS * SLICE,
        crashes_injected=len(crashes),
        crash_points=dict(Counter(crashes.values())),
        handler_executions=sum(executions.values()),
        executed_twice=sum(1 for c in executions.values() if c == 2),
        duplicates_executed=sum(1 for i, c in executions.items() if c > 1 and i not in crashes),
        effects_lost=len(lost),
        results_mismatched=len(mismatched),
        # take_over (the default) never parks: a crash inside is a takeover.
        parked=sum(
            1
            for effect in stored.values()
            if effect is not None and any(isinstance(e, Parked) for e in effect.history)
        ),
    )
