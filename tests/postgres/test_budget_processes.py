"""Eight processes spend from one budget on one PostgreSQL database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent_ledger import Budget
from agent_ledger.budgets import Spend
from agent_ledger.testing import build_ledger
from tests.budget_worker import BUDGET, WORKFLOW
from tests.processes import REPO, finish

WORKERS = 8


def _spawn(url: str, worker: int, log: Path, start_at: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.budget_worker",
            "--url",
            url,
            "--worker",
            str(worker),
            "--log",
            str(log),
            "--start-at",
            str(start_at),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_eight_processes_never_spend_past_one_budget(
    pg: Any, dsn: str, schema: str, tmp_path: Path
) -> None:
    log = tmp_path / "paid.log"
    url = f"{dsn}?schema={schema}"
    start_at = time.time() + 3.0
    workers = [_spawn(url, i, log, start_at) for i in range(WORKERS)]
    outcomes = [await asyncio.to_thread(finish, w, 120) for w in workers]
    paid = [tuple(int(x) for x in line.split()) for line in log.read_text().splitlines()]
    # Every provider call was one granted call (replays reached nobody), once.
    assert sorted((w, n) for w, n, _ in paid) == sorted(
        (i, n) for i, o in enumerate(outcomes) for n in range(len(o["granted"]))
    )
    assert all(o["refused_at"] is not None for o in outcomes), "every worker ran out"
    total = sum(cost for _, _, cost in paid)
    limit = BUDGET.usd_micros
    assert limit is not None
    # The bound is the limit plus one call's overshoot (an estimate too
    # low: tests/contract/test_budgets.py). Every estimate here is its call's
    # upper bound, so no interleaving of the eight may go over at all.
    assert total <= limit
    # A call is refused only when the spent and reserved amounts (each call at
    # most its $0.30 estimate) leave less than $0.30: ten calls always fit.
    assert len(paid) >= 10
    # A restarted worker (a new store and ledger) sees exactly what was paid.
    ledger = build_ledger(pg.store)
    state = await ledger.budget(WORKFLOW)
    assert state is not None and state.limits == Budget(usd=3.0)
    assert state.spent.usd_micros == total
    assert state.reserved == Spend() and state.holds == 0
