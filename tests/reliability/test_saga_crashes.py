"""Saga workers SIGKILLed at random points of forward steps and compensations,
on PostgreSQL and SQLite: after recovery no saga is left open, every step that
took effect in a rolled-back saga was undone exactly once, and none twice."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from agent_ledger import open_store
from agent_ledger.sagas import SagaStatus
from agent_ledger.sagas._saga import saga_store
from agent_ledger.testing import build_ledger
from tests.harness import DSN, TEST_SCHEMA, open_harness
from tests.reliability.conftest import report
from tests.reliability.saga_crash_worker import saga_id

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
WORKERS, SLICE = 4, 8
POINTS = ("forward", "before-undo", "undo")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    async with open_harness("postgres"):  # empties this session's schema
        yield f"{DSN}?schema={TEST_SCHEMA}"


def _worker(url: str, log: Path, first: int, crash_at: int, point: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.saga_crash_worker", url, str(log),
         str(first), str(SLICE), str(crash_at), point],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


async def test_sigkill_inside_sagas(url: str, tmp_path: Path, rng: random.Random) -> None:
    log = tmp_path / "events.jsonl"
    crashes: dict[int, str] = {}
    victims = []
    for w in range(WORKERS):
        first = w * SLICE
        # Odd sagas roll back, so every crash point is reached in them.
        crash_at = first + 2 * rng.randrange(SLICE // 2) + 1
        crashes[crash_at] = POINTS[w % len(POINTS)] if w < len(POINTS) else rng.choice(POINTS)
        victims.append(_worker(url, log, first, crash_at, crashes[crash_at]))
    for victim in victims:
        _, err = await asyncio.to_thread(victim.communicate, timeout=120)
        assert victim.returncode == -9, err.decode()[-2000:]
    recoverers = [_worker(url, log, 0, -1, "none") for _ in range(2)]
    for recoverer in recoverers:
        _, err = await asyncio.to_thread(recoverer.communicate, timeout=300)
        assert recoverer.returncode == 0, err.decode()[-3000:]

    store = await open_store(url)
    try:
        sagas = saga_store(build_ledger(store))
        stored = {i: await sagas.get_saga(saga_id(i)) for i in range(WORKERS * SLICE)}
    finally:
        await store.close()
    # A worker's sagas after its crash never started: only those that began count.
    began = {i: s for i, s in stored.items() if s is not None}
    unfinished = [i for i, s in began.items() if not s.status.is_terminal]
    assert unfinished == []
    events = [orjson.loads(line) for line in log.read_text().splitlines()]
    calls = [e for e in events if e["event"] == "provider"]
    handler_runs = Counter(e["key"] for e in events if e["event"] == "handler")
    assert [k for k, n in handler_runs.items() if n > 2] == [], "at most once more after a kill"
    # The distinct keys each saga's side effects reached the provider with: a
    # provider honouring keys acts once per key, so two keys would be two refunds.
    keys: dict[tuple[str, int], set[str]] = {}
    for e in calls:
        keys.setdefault((e["kind"], e["i"]), set()).add(e["key"])
    double = 0
    for i, saga in began.items():
        undos = {kind: len(keys.get((kind, i), ())) for kind in ("refund", "release")}
        double += sum(n > 1 for n in undos.values())
        if saga.status is SagaStatus.COMPLETED:
            assert i % 2 == 0 and i not in crashes
            assert undos == {"refund": 0, "release": 0}, i
            continue
        assert saga.status is SagaStatus.COMPENSATED, (i, saga.status)
        charged, reserved = (("charge", i) in keys), (("reserve", i) in keys)
        assert undos == {"refund": int(charged), "release": int(reserved)}, (i, undos)
    assert double == 0
    undo_keys = {e["key"] for e in calls if e["kind"] in ("refund", "release")}
    report(
        "saga crashes (SIGKILL)",
        store=url.split(":", 1)[0],
        sagas=len(began),
        crashes=dict(Counter(crashes.values())),
        compensated=sum(s.status is SagaStatus.COMPENSATED for s in began.values()),
        completed=sum(s.status is SagaStatus.COMPLETED for s in began.values()),
        undo_handlers_run_again_after_a_kill=sum(handler_runs[k] > 1 for k in undo_keys),
        double_compensations=double,
        unfinished_after_recovery=len(unfinished),
    )
