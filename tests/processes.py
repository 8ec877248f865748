"""Helpers for tests that run `tests.worker` in other processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent


def spawn(url: str, mode: str, *args: str) -> subprocess.Popen[str]:
    """Start `python -m tests.worker MODE --url URL ...`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.worker", mode, "--url", url, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> Any:
    """Wait for a worker, require success, and return its last JSON line."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return orjson.loads(out.strip().splitlines()[-1])


def executions(log: Path) -> list[tuple[int, int]]:
    """(pid, attempt) of every handler execution the workers logged."""
    if not log.exists():
        return []
    return [(int(p), int(a)) for p, a in (line.split() for line in log.read_text().splitlines())]
