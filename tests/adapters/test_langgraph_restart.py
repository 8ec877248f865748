"""LangGraph across real processes: a thread paused for approval is resumed by another
process, and a process killed right after a side effect is recovered without repeating it.

Each step is ``python -m tests.adapters.langgraph_agent DIR PHASE``: the same
agent, a ledger on ``DIR/ledger.db`` and a ``SqliteSaver`` on
``DIR/checkpoints.db``, nothing shared but the files.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.processes import REPO

pytestmark = pytest.mark.slow


def phase(directory: Path, name: str, *, expect: int = 0) -> Any:
    """Run one phase in a new process; its JSON line, or None when it was killed."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.adapters.langgraph_agent", str(directory), name],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == expect, done.stderr
    return orjson.loads(done.stdout.strip().splitlines()[-1]) if expect == 0 else None


def sent(directory: Path) -> list[str]:
    path = directory / "sent.log"
    return path.read_text().splitlines() if path.exists() else []


def test_a_paused_thread_is_approved_and_run_once_by_another_process(tmp_path: Path) -> None:
    """Process 1 pauses on the refund; process 2 resumes with ada's approval: it runs once."""
    asked = phase(tmp_path, "ask")
    (pause,) = asked["pauses"]
    assert pause["tool"] == "payments.refund" and sent(tmp_path) == []
    approved = phase(tmp_path, "approve")
    assert approved["last"] == "done: refunded 5000 on o7" and approved["pauses"] == []
    assert sent(tmp_path) == ["refund o7"]


def test_a_process_killed_after_the_side_effect_is_recovered_without_repeating_it(
    tmp_path: Path,
) -> None:
    """os._exit right after the tool ran, before LangGraph kept its result: the next process
    re-runs the tool call, which the ledger answers from the receipt."""
    phase(tmp_path, "crash", expect=3)
    assert sent(tmp_path) == ["reminder ada"]
    recovered = phase(tmp_path, "recover")
    assert recovered["last"] == "done: reminder sent to ada"
    assert sent(tmp_path) == ["reminder ada"]
    # The call was made again (answered from the receipt), not skipped by LangGraph.
    assert recovered["effects"] == [
        {"tool": "mail.send_reminder", "executions": 1, "dedup_count": 1}
    ]
