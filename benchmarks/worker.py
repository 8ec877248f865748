"""Scaling worker: N fresh calls with 8 concurrent tasks, starting at an agreed time;
prints the wall-clock time it finished."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from agent_ledger import EffectLedger, EffectLedgerOptions, ToolCall, open_store
from benchmarks.floors import handler
from benchmarks.scenarios import drive


async def main(url: str, calls: int, start_at: float) -> None:
    store = await open_store(url)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    run_id = uuid.uuid4().hex
    work = [ToolCall(workflow_id=f"scale-{run_id}", tool="t", args={"i": i}) for i in range(calls)]
    await asyncio.sleep(max(0.0, start_at - time.time()))
    await drive(work, lambda c: ledger.run(c, handler), 8)
    print(time.time(), flush=True)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
