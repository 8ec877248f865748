"""A worker process that runs the same calls as its siblings, in its own order.

`python -m tests.reliability.race_worker URL LOG KEYS SEED START_AT`

It waits until START_AT (a time.time()), then runs calls 0..KEYS-1 over 4
tasks in an order shuffled by SEED, logging every handler execution and
every result it was given as a JSON line, so the parent can check that each
key ran once and every process got the same receipt.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from typing import Any

import orjson

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    RunOptions,
    ToolCall,
    open_store,
)
from agent_ledger.options import ConcurrencyOptions

TASKS = 4


def call_for(i: int) -> ToolCall:
    return ToolCall(workflow_id="race-suite", tool="side.effect", args={"i": i})


def log(path: str, **record: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, orjson.dumps({"pid": os.getpid(), **record}) + b"\n")
    finally:
        os.close(fd)


async def main(url: str, path: str, keys: int, seed: int, start_at: float) -> None:
    store = await open_store(url)
    waiting = ConcurrencyOptions(wait_timeout_ms=60_000, initial_interval_ms=5)
    ledger = EffectLedger(
        EffectLedgerOptions(
            store=store, defaults=LedgerDefaults(run=RunOptions(concurrency=waiting))
        )
    )
    order = list(range(keys))
    random.Random(seed).shuffle(order)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in order:
        queue.put_nowait(i)

    async def handler(effect: Effect) -> dict[str, Any]:
        number = effect.args.get("i") if isinstance(effect.args, dict) else None
        i = number if isinstance(number, int) else -1
        log(path, event="executed", i=i)
        await asyncio.sleep(0.01)  # long enough for the others to arrive meanwhile
        return {"i": i, "by": os.getpid()}

    async def lane() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            result = await ledger.run(call_for(i), handler)
            log(path, event="returned", i=i, result=result)

    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        await asyncio.gather(*(lane() for _ in range(TASKS)))
    finally:
        await store.close()


if __name__ == "__main__":
    url, path, keys, seed, start_at = sys.argv[1:6]
    asyncio.run(main(url, path, int(keys), int(seed), float(start_at)))
