"""Deleting the ``<db>-holders`` folder (or locking it) never gets a live SQLite
worker taken over (issue 26 follow-up, finding 3).

A worker process runs a call (lease 1 s, handler 3 s); another process holds
SQLite's write lock (``store.transaction()``) for 2.5 s and is SIGKILLed, so
the worker's heartbeats cannot land in the database and its holder file is
the only evidence that it is alive. Meanwhile the test either deletes the
folder every 5 ms (``rmtree``) or makes it unreadable (``chmod``), and a
second worker process polls to take the call over.

Before the fix a missing file counted as a holder that never showed life:
the adversary's ``a1d`` script had the live worker run twice in 3 of 3
trials. Now a folder born again less than a lease ago (its ``.born`` marker)
is evidence of life for every holding in it, and a folder that cannot be
read is no evidence of death: each trial runs the handler once.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from agent_ledger import SqliteStore
from tests.reliability.conftest import report
from tests.reliability.test_writer_contention import spawn, wait_for, wait_line

pytestmark = pytest.mark.slow
TRIALS = int(os.environ.get("AGENT_LEDGER_CONTENTION_TRIALS", "3"))
HOLD_S = 2.5


def trial(folder: Path, attack: str) -> int:
    folder.mkdir()
    path = folder / "ledger.db"
    SqliteStore(path)
    holders = Path(f"{path}-holders")
    log = folder / "runs.log"
    first = spawn("run", str(path), str(log))
    wait_for(log)
    holder = spawn("hold", str(path))
    wait_line(holder, "holding")
    stop = threading.Event()

    def delete() -> None:
        while not stop.is_set():
            shutil.rmtree(holders, ignore_errors=True)
            time.sleep(0.005)

    deleter = threading.Thread(target=delete)
    if attack == "rmtree":
        deleter.start()
    else:
        holders.mkdir(exist_ok=True)
        holders.chmod(0o000)
    second = spawn("run", str(path), str(log))
    try:
        time.sleep(HOLD_S)
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
        for worker in (first, second):
            out, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err
            assert out.strip() == "ch_1", err
    finally:
        stop.set()
        if deleter.is_alive():
            deleter.join()
        if holders.exists():
            holders.chmod(0o755)
    return len(log.read_text().splitlines())


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder of mode 000 all the same")
def test_an_unreadable_holders_folder_never_gets_a_live_worker_taken_over(tmp_path: Path) -> None:
    runs = [trial(tmp_path / f"trial-{n}", "chmod") for n in range(TRIALS)]
    assert sum(1 for n in runs if n > 1) == 0, runs


def test_deleting_the_holders_folder_never_gets_a_live_worker_taken_over(tmp_path: Path) -> None:
    runs = [trial(tmp_path / f"trial-{n}", "rmtree") for n in range(TRIALS)]
    taken_over = sum(1 for n in runs if n > 1)
    report(
        "writer contention on SQLite, holders folder deleted every 5 ms",
        trials=TRIALS,
        live_workers_taken_over=taken_over,
    )
    assert taken_over == 0, runs
