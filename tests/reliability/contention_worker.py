"""The processes of the writer-contention test (``test_writer_contention.py``).

``python -m tests.reliability.contention_worker MODE DB LOG``:

* ``run``: run the call (lease 1 s, polling every 20 ms), its handler logging
  ``<pid> <attempt>`` to LOG and then working for 3 s;
* ``run-tx``: as ``run``, and once the file ``DB.holding`` appears the
  handler's process opens ``store.transaction()`` on its own store, which
  waits for the write lock another process holds;
* ``rawhold``: hold SQLite's write lock with a plain ``BEGIN IMMEDIATE`` (no
  agent-ledger), say so, and commit after HOLD seconds (a live writer);
* ``hold``: take SQLite's write lock (``store.transaction()``), say so on
  stdout, and hold it until killed;
* ``stream``: short transactions of 45 ms each, back to back, for 3 s;
* ``purge``: one ``purge()`` of every succeeded effect (the test fills the
  file first), printing how long it held the write lock.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time
from datetime import timedelta
from pathlib import Path

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    LedgerDefaults,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.options import ConcurrencyOptions, StaleOptions

LEASE_MS = 1_000
CALL = ToolCall(workflow_id="wf", tool="payments.charge", args={"cents": 100})


async def run(path: Path, log: Path, *, own_tx: bool = False) -> None:
    store = SqliteStore(path)
    options = RunOptions(
        stale=StaleOptions(after_ms=LEASE_MS),
        concurrency=ConcurrencyOptions(wait_timeout_ms=30_000, initial_interval_ms=20),
    )
    ledger = EffectLedger(EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=options)))

    async def own_transaction() -> None:
        flag = Path(f"{path}.holding")
        while not flag.exists():
            await asyncio.sleep(0.01)
        async with store.transaction():
            pass

    async def charge(effect: Effect) -> str:
        with log.open("a") as file:
            file.write(f"{os.getpid()} {effect.attempt}\n")
        if own_tx:
            side = asyncio.create_task(own_transaction())
        await asyncio.sleep(3.0)
        if own_tx:
            await side
        return "ch_1"

    try:
        print(await ledger.run(CALL, charge), flush=True)
    finally:
        await store.close()


async def hold(path: Path) -> None:
    store = SqliteStore(path)
    async with store.transaction():
        print("holding", flush=True)
        await asyncio.sleep(3600)


def rawhold(path: Path, hold_s: float) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("holding", flush=True)
    time.sleep(hold_s)
    conn.execute("COMMIT")
    conn.close()


async def stream(path: Path) -> None:
    store = SqliteStore(path)
    end = time.monotonic() + 3.0
    print("streaming", flush=True)
    while time.monotonic() < end:
        async with store.transaction():
            await asyncio.sleep(0.045)  # the write lock held, as by a busy writer
    await store.close()


async def purge(path: Path) -> None:
    store = SqliteStore(path)
    print("purging", flush=True)
    started = time.monotonic()
    await store.purge(older_than=timedelta(0), statuses=frozenset({EffectStatus.SUCCEEDED}))
    print(f"held {time.monotonic() - started:.2f}", flush=True)
    await store.close()


def main() -> None:
    mode, path = sys.argv[1], Path(sys.argv[2])
    if mode in ("run", "run-tx"):
        asyncio.run(run(path, Path(sys.argv[3]), own_tx=mode == "run-tx"))
    elif mode == "rawhold":
        rawhold(path, float(sys.argv[3]))
    elif mode == "hold":
        asyncio.run(hold(path))
    elif mode == "stream":
        asyncio.run(stream(path))
    else:
        asyncio.run(purge(path))


if __name__ == "__main__":
    main()
