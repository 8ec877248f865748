"""The processes of the writer-contention test (``test_writer_contention.py``).

``python -m tests.reliability.contention_worker MODE DB LOG``:

* ``run``: run the call (lease 1 s, polling every 20 ms), its handler logging
  ``<pid> <attempt>`` to LOG and then working for 3 s;
* ``hold``: take SQLite's write lock (``store.transaction()``), say so on
  stdout, and hold it until killed;
* ``stream``: short transactions of 45 ms each, back to back, for 3 s;
* ``purge``: one ``purge()`` of every succeeded effect (the test fills the
  file first), printing how long it held the write lock.
"""

from __future__ import annotations

import asyncio
import os
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


async def run(path: Path, log: Path) -> None:
    store = SqliteStore(path)
    options = RunOptions(
        stale=StaleOptions(after_ms=LEASE_MS),
        concurrency=ConcurrencyOptions(wait_timeout_ms=30_000, initial_interval_ms=20),
    )
    ledger = EffectLedger(EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=options)))

    async def charge(effect: Effect) -> str:
        with log.open("a") as file:
            file.write(f"{os.getpid()} {effect.attempt}\n")
        await asyncio.sleep(3.0)
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
    if mode == "run":
        asyncio.run(run(path, Path(sys.argv[3])))
    elif mode == "hold":
        asyncio.run(hold(path))
    elif mode == "stream":
        asyncio.run(stream(path))
    else:
        asyncio.run(purge(path))


if __name__ == "__main__":
    main()
