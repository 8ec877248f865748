"""A transaction of the holder's own process, waiting for another process's
write lock, never makes a live holder look dead on SQLite (issue 26 follow-up,
finding 1).

A worker process runs a call (lease 1 s) whose handler works for 3 s and,
once a third process holds SQLite's write lock, opens ``store.transaction()``
on its own store: that transaction waits for the lock, and the store's gate
makes every other step of that store wait behind it, heartbeats included.
Other worker processes ask for the same call meanwhile (polling every 20 ms),
ready to take it over the moment it looks dead. The attacker:

* ``killed``: holds ``store.transaction()`` for 2.5 s and is SIGKILLed;
* ``live``: a plain ``BEGIN IMMEDIATE`` held for 2.5 s, then committed;
* ``stream``: short transactions (45 ms each) back to back for 3 s.

Variants: three claimers at once, and claimers that name the file through a
symlink. Before the fix a heartbeat waited at the gate before stamping its
holder file, so no process showed the holder alive and it was taken over in
every trial (killed 2/2, live 4/4 with the adversary's script); now the
heartbeat stamps the file before any wait, and each trial runs the handler once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from agent_ledger import SqliteStore
from tests.reliability.conftest import report
from tests.reliability.test_writer_contention import spawn, wait_for, wait_line

pytestmark = pytest.mark.slow
TRIALS = int(os.environ.get("AGENT_LEDGER_CONTENTION_TRIALS", "3"))
HOLD_S = 2.5


def trial(folder: Path, attack: str, claimers: int, symlinked: bool) -> int:
    """One trial: how many times the handler ran."""
    folder.mkdir()
    path = folder / "ledger.db"
    SqliteStore(path)
    other_name = path
    if symlinked:
        other_name = folder / "link.db"
        other_name.symlink_to(path)
    log = folder / "runs.log"
    first = spawn("run-tx", str(path), str(log))
    wait_for(log)
    if attack == "killed":
        attacker = spawn("hold", str(path))
    elif attack == "live":
        attacker = spawn("rawhold", str(path), str(HOLD_S))
    else:
        attacker = spawn("stream", str(path))
    wait_line(attacker, "streaming" if attack == "stream" else "holding")
    Path(f"{path}.holding").write_text("x")
    others = [spawn("run", str(other_name), str(log)) for _ in range(claimers)]
    if attack == "killed":
        time.sleep(HOLD_S)
        attacker.send_signal(signal.SIGKILL)
        attacker.communicate()
    else:
        _, err = attacker.communicate(timeout=60)
        assert attacker.returncode == 0, err
    for worker in (first, *others):
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert out.strip() == "ch_1", err
    return len(log.read_text().splitlines())


@pytest.mark.parametrize(
    ("attack", "claimers", "symlinked"),
    [
        ("killed", 1, False),
        ("live", 1, False),
        ("stream", 1, False),
        ("killed", 3, False),
        ("killed", 1, True),
    ],
)
def test_a_transaction_waiting_in_the_holders_own_process_never_gets_it_taken_over(
    tmp_path: Path, attack: str, claimers: int, symlinked: bool
) -> None:
    runs = [trial(tmp_path / f"trial-{n}", attack, claimers, symlinked) for n in range(TRIALS)]
    taken_over = sum(1 for n in runs if n > 1)
    report(
        f"writer contention on SQLite, own-process transaction waiting ({attack}, "
        f"{claimers} claimer(s){', symlinked' if symlinked else ''})",
        trials=TRIALS,
        live_workers_taken_over=taken_over,
    )
    assert taken_over == 0, runs
