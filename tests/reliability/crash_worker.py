"""A worker that runs a slice of calls and SIGKILLs itself at one chosen point.

`python -m tests.reliability.crash_worker URL LOG FIRST COUNT CRASH_AT POINT AFTER_MS`

It runs calls FIRST..FIRST+COUNT-1 in order; at call CRASH_AT it dies at POINT:
`before` (after begin, before the handler), `inside` (in the handler, after
its side effect), or `commit` (handler done, before the outcome is stored).
Every handler execution and every result received is appended to LOG as a
JSON line, flushed, so the parent can check them against the database.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any, NoReturn

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
from agent_ledger.options import StaleOptions
from agent_ledger.stores.base import Store
from agent_ledger.testing import FaultyStore


def log(path: str, **record: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, orjson.dumps({"pid": os.getpid(), **record}) + b"\n")
    finally:
        os.close(fd)


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")


def call_for(i: int) -> ToolCall:
    return ToolCall(workflow_id="crash-suite", tool="side.effect", args={"i": i})


def arm_crash(store: FaultyStore[Store], point: str) -> None:
    """Die at ``point`` of the next run: `commit` before the outcome reaches the store,
    `before` once begin has landed (its "error" is the SIGKILL)."""
    if point == "commit":
        store.fail("commit", when="before", error=die)
    elif point == "before":
        store.fail("begin", when="after", error=die)


async def main(
    url: str, path: str, first: int, count: int, crash_at: int, point: str, after_ms: int
) -> None:
    store = FaultyStore(await open_store(url))
    ledger = EffectLedger(
        EffectLedgerOptions(
            store=store,
            defaults=LedgerDefaults(run=RunOptions(stale=StaleOptions(after_ms=after_ms))),
        )
    )
    for i in range(first, first + count):
        if i == crash_at:
            arm_crash(store, point)

        async def handler(effect: Effect, i: int = i) -> dict[str, Any]:
            log(path, event="executed", i=i, attempt=effect.attempt)
            if point == "inside" and i == crash_at:
                die()
            return {"i": i, "by": os.getpid(), "attempt": effect.attempt}

        result = await ledger.run(call_for(i), handler)
        log(path, event="returned", i=i, result=result)
    await store.close()


if __name__ == "__main__":
    url, path, first, count, crash_at, point, after_ms = sys.argv[1:8]
    asyncio.run(main(url, path, int(first), int(count), int(crash_at), point, int(after_ms)))
