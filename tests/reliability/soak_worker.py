"""One process of the soak: `python -m tests.reliability.soak_worker URL LOG PROC CALLS TASKS SEED`.

Keys are `k<n>`. Most calls are fresh keys of this process; about 10 % repeat
a key some process uses (duplicates, across processes too); keys whose number
is 0 mod 20 fail in the handler (5 %), 1 mod 100 need approval (1 %), which
the parent grants. Logs every execution and every outcome as JSON lines.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from typing import Any

import orjson

from agent_ledger import (
    Effect,
    EffectFailedError,
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    RunOptions,
    ToolCall,
    open_store,
)
from agent_ledger.options import ConcurrencyOptions

OPTIONS = RunOptions(
    concurrency=ConcurrencyOptions(wait_timeout_ms=60_000, approval_timeout_ms=60_000)
)


class Declined(Exception):
    code = "declined"


def key_numbers(proc: int, calls: int, seed: int) -> list[int]:
    rng = random.Random(seed * 1_000 + proc)
    own = [proc * 1_000_000 + i for i in range(calls)]
    numbers = []
    for n in own:
        if rng.random() < 0.10:
            other = rng.randrange(4)
            numbers.append(other * 1_000_000 + rng.randrange(calls))  # may be another process's key
        else:
            numbers.append(n)
    return numbers


def call_for(n: int) -> ToolCall:
    return ToolCall(workflow_id="soak", tool="pay", args={"n": n})


def log(fd: int, **record: Any) -> None:
    os.write(fd, orjson.dumps(record) + b"\n")


async def main(url: str, path: str, proc: int, calls: int, tasks: int, seed: int) -> None:
    store = await open_store(url)
    ledger = EffectLedger(EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=OPTIONS)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    queue = key_numbers(proc, calls, seed)

    async def one(n: int) -> None:
        async def handler(effect: Effect) -> dict[str, int]:
            log(fd, event="executed", n=n, pid=os.getpid())
            if n % 20 == 0:
                raise Declined(f"card {n} declined")
            return {"n": n, "charged": n * 3}

        approval = RunOptions(requires_approval=n % 100 == 1)
        try:
            result = await ledger.run(call_for(n), handler, approval)
            log(fd, event="outcome", n=n, result=result)
        except (Declined, EffectFailedError) as exc:
            log(fd, event="outcome", n=n, failed=type(exc).__name__)

    async def worker() -> None:
        while queue:
            await one(queue.pop())

    await asyncio.gather(*(worker() for _ in range(tasks)))
    os.close(fd)
    await store.close()


if __name__ == "__main__":
    url, path, proc, calls, tasks, seed = sys.argv[1:7]
    asyncio.run(main(url, path, int(proc), int(calls), int(tasks), int(seed)))
