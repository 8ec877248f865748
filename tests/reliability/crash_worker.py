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
from typing import Any

import orjson

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    RunOptions,
    StaleOptions,
    ToolCall,
    open_store,
)


def log(path: str, **record: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, orjson.dumps({"pid": os.getpid(), **record}) + b"\n")
    finally:
        os.close(fd)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def call_for(i: int) -> ToolCall:
    return ToolCall(workflow_id="crash-suite", tool="side.effect", args={"i": i})


async def main(
    url: str, path: str, first: int, count: int, crash_at: int, point: str, after_ms: int
) -> None:
    store = await open_store(url)
    current: dict[str, int] = {"i": -1}
    if point == "commit":
        original = store.commit

        async def complete(*args: Any, **kwargs: Any) -> bool:
            if current["i"] == crash_at:
                die()
            return await original(*args, **kwargs)

        store.commit = complete  # type: ignore[method-assign]
    if point == "before":
        original_begin = store.begin

        async def begin(*args: Any, **kwargs: Any) -> Any:
            outcome = await original_begin(*args, **kwargs)
            if current["i"] == crash_at:
                die()
            return outcome

        store.begin = begin  # type: ignore[method-assign]

    ledger = EffectLedger(
        EffectLedgerOptions(
            store=store,
            defaults=LedgerDefaults(run=RunOptions(stale=StaleOptions(after_ms=after_ms))),
        )
    )
    for i in range(first, first + count):
        current["i"] = i

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
