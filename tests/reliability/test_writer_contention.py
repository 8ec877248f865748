"""Writer contention on SQLite never makes a live holder look dead (issue 26, item 1).

A worker process runs a call (lease 1 s) whose handler works for 3 s; a
second worker process asks for the same call meanwhile, polling every 20 ms,
ready to take it over the moment it looks dead. A third process holds
SQLite's write lock around the end of the first worker's lease, so that
worker's heartbeats cannot land:

* ``killed``: it holds ``store.transaction()`` for 1.3 s and is SIGKILLed;
* ``stream``: it runs short transactions (45 ms each) back to back for 3 s;
* ``purge``: one ``purge()`` of a large file holds the lock for over a lease.

Before the fix the second worker won the lock first often enough to take the
live worker over and run the handler again; now the first worker's file in
``<db>-holders/`` (a heartbeat written without the write lock) keeps it
alive, and every trial runs the handler once. Measured on the code before
the fix (4 trials each): killed 2, stream 1, purge 3 live workers taken over.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_ledger import SqliteStore
from tests.reliability.conftest import report

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("AGENT_LEDGER_CONTENTION_TRIALS", "4"))
LEASE_S = 1.0
#: Rows the purge deletes: enough to hold the write lock for over a lease here.
PURGE_ROWS = int(os.environ.get("AGENT_LEDGER_CONTENTION_PURGE_ROWS", "600000"))


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.contention_worker", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_line(process: subprocess.Popen[str], expected: str) -> str:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    assert line.startswith(expected), process.stderr.read() if process.stderr else line
    return line


def wait_for(path: Path, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.01)


def filled(folder: Path) -> Path:
    """A ledger file with PURGE_ROWS old succeeded effects, made once per session."""
    template = folder / "filled.db"
    if template.exists():
        return template
    SqliteStore(template)
    with sqlite3.connect(template) as conn:
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
            " INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
            " args_canonical, created_us, updated_us, heartbeat_us, completed_us)"
            " SELECT printf('old-%d', i), printf('old-%d', i), 'old', 'old.tool', 'succeeded',"
            " '{}', 1, 1, 1, 1 FROM n",
            (PURGE_ROWS,),
        )
    return template


def trial(folder: Path, attack: str) -> tuple[int, str]:
    """One trial: how many times the handler ran, and what the attacker said."""
    folder.mkdir()
    path = folder / "ledger.db"
    if attack == "purge":
        shutil.copy(filled(folder.parent), path)
    else:
        SqliteStore(path)
    log = folder / "runs.log"
    first = spawn("run", str(path), str(log))
    wait_for(log)
    second = spawn("run", str(path), str(log))
    said = ""
    if attack == "killed":
        attacker = spawn("hold", str(path))
        wait_line(attacker, "holding")
        time.sleep(LEASE_S + 0.3)
        attacker.send_signal(signal.SIGKILL)
        attacker.communicate()
    else:
        attacker = spawn(attack, str(path))
        out, err = attacker.communicate(timeout=120)
        assert attacker.returncode == 0, err
        said = out.strip().splitlines()[-1]
    for worker in (first, second):
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert out.strip() == "ch_1"
    return len(log.read_text().splitlines()), said


@pytest.mark.parametrize("attack", ["killed", "stream", "purge"])
def test_writers_holding_the_lock_never_get_a_live_worker_taken_over(
    tmp_path: Path, attack: str
) -> None:
    runs = [trial(tmp_path / f"trial-{n}", attack) for n in range(TRIALS)]
    taken_over = sum(1 for n, _ in runs if n > 1)
    report(
        f"writer contention on SQLite ({attack})",
        trials=TRIALS,
        live_workers_taken_over=taken_over,
        attacker=[said for _, said in runs] if attack == "purge" else None,
    )
    if attack == "purge":
        # The attack must be one: the purge held the lock for over a lease.
        assert all(float(said.split()[1]) > LEASE_S for _, said in runs), runs
    assert taken_over == 0, runs
