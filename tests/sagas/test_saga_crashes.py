"""Saga workers SIGKILLed mid-saga, on PostgreSQL and SQLite, across processes:
another process (a recoverer, two at once, or a re-run of the code) finishes
the undo, and each compensation takes effect exactly once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.harness import DSN, TEST_SCHEMA, open_harness
from tests.processes import REPO
from tests.sagas.saga_worker import SAGA_ID


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def shared(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh, empty ledger that worker processes share."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    async with open_harness("postgres"):  # empties this session's schema
        yield f"{DSN}?schema={TEST_SCHEMA}"


def _worker(url: str, tmp: Path, mode: str, crash: str = "none") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.sagas.saga_worker", url, str(tmp / "log.jsonl"),
         str(tmp / "refunds.jsonl"), mode, crash],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def _wait(process: subprocess.Popen[str]) -> tuple[int, Any]:
    out, err = await asyncio.to_thread(process.communicate, timeout=90)
    lines = out.strip().splitlines()
    if process.returncode == 0:
        return 0, orjson.loads(lines[-1])
    assert process.returncode == -9, err[-3000:]
    return -9, None


def _events(tmp: Path, name: str) -> list[dict[str, Any]]:
    path = tmp / name
    return [orjson.loads(x) for x in path.read_text().split()] if path.exists() else []


async def _killed(url: str, tmp: Path, crash: str) -> None:
    code, _ = await _wait(_worker(url, tmp, "run", crash))
    assert code == -9


@pytest.mark.parametrize("finisher", ["one recoverer", "two recoverers", "a re-run"])
async def test_killed_before_the_undo(shared: str, tmp_path: Path, finisher: str) -> None:
    """Killed once step 2 failed and the saga was marked compensating, before
    step 1's undo: the finisher ends it compensated, the refund ran once."""
    await _killed(shared, tmp_path, "before-undo")
    assert Counter(e["event"] for e in _events(tmp_path, "log.jsonl")) == {
        "charge": 1,
        "reserve": 1,
    }
    mode, count = {"one recoverer": ("recover", 1), "two recoverers": ("recover", 2)}.get(
        finisher, ("rerun", 1)
    )
    finishers = [_worker(shared, tmp_path, mode) for _ in range(count)]
    results = [await _wait(p) for p in finishers]
    assert results == [(0, {"status": "compensated"})] * count
    events = _events(tmp_path, "log.jsonl")
    assert Counter(e["event"] for e in events) == {"charge": 1, "reserve": 1, "refund": 1}
    assert len(_events(tmp_path, "refunds.jsonl")) == 1


async def test_killed_inside_the_undo_after_its_side_effect(shared: str, tmp_path: Path) -> None:
    """The refund reached the provider, then the worker died before recording it:
    the recoverer runs the handler again with the same key, and the provider,
    honouring it, refunds once."""
    await _killed(shared, tmp_path, "inside-undo")
    code, result = await _wait(_worker(shared, tmp_path, "recover"))
    assert (code, result) == (0, {"status": "compensated"})
    refunds = [e for e in _events(tmp_path, "log.jsonl") if e["event"] == "refund"]
    assert len(refunds) == 2, "at most twice: once before the kill, once after"
    assert len({e["key"] for e in refunds}) == 1 and [e["attempt"] for e in refunds] == [1, 2]
    assert len(_events(tmp_path, "refunds.jsonl")) == 1
    assert SAGA_ID == "order-42"
