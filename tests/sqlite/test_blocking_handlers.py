"""A plain handler that blocks must not stall the heartbeats (issue 10, item 16).

Two workers on one SQLite file, each with its own event loop in its own
thread (as two processes would be): worker A runs a handler that blocks for
longer than the lease; worker B calls the same effect meanwhile. Run on A's
event loop, the block silences A's heartbeats and B takes the effect over:
two executions. Run in a worker thread (the default), A stays alive.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from agent_ledger import (
    EffectFailedError,
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.options import ConcurrencyOptions, StaleOptions, SyncHandlers

CALL = ToolCall(workflow_id="wf", tool="payments.charge", args={"cents": 100})


def _worker(path: Path, mode: SyncHandlers, delay_s: float, log: list[str]) -> None:
    async def main() -> None:
        await asyncio.sleep(delay_s)
        store = SqliteStore(path)
        options = RunOptions(
            stale=StaleOptions(after_ms=600),
            concurrency=ConcurrencyOptions(wait_timeout_ms=10_000, initial_interval_ms=20),
            sync_handlers=mode,
        )
        ledger = EffectLedger(
            EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=options))
        )

        def charge(effect: object) -> str:
            log.append("charged")
            time.sleep(1.5)  # a blocking client call, two and a half leases long
            return "ch_1"

        try:
            log.append(f"returned {await ledger.run(CALL, charge)}")
        except EffectFailedError as exc:
            log.append(f"raised {exc.code}")
        finally:
            await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["thread", "loop"])
def test_a_blocking_handler_is_taken_over_only_on_the_loop(
    tmp_path: Path, mode: SyncHandlers
) -> None:
    path = tmp_path / "ledger.db"
    SqliteStore(path)  # create the schema before the workers race
    log: list[str] = []
    workers = [
        threading.Thread(target=_worker, args=(path, mode, delay, log)) for delay in (0.0, 0.2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    if mode == "thread":
        assert sorted(log) == ["charged", "returned ch_1", "returned ch_1"]
    else:
        # On the loop the workers take the effect from each other, at most
        # until the takeover bound (3) ends it with a failed receipt.
        assert 2 <= log.count("charged") <= 4
        assert "returned ch_1" in log or "raised too_many_takeovers" in log
