"""A worker whose retried handler keeps failing; the test SIGKILLs it while it waits to retry.

`python -m tests.reliability.retry_worker URL LOG LEASE_MS WORKFLOW`

It runs one call (``call_for(WORKFLOW)``) with ``POLICY``. Every try of the
handler appends a ``try`` record to LOG (the try's number, from
``effect.tries``, and the attempt) and raises ``ConnectionError``. The
ledger's sleep appends a ``backoff`` record before each wait; the wait after
try ``HANG_AFTER`` never ends, so the test can kill the worker inside it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Final, NoReturn

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    RetryPolicy,
    RunOptions,
    ToolCall,
    open_store,
)
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from tests.reliability.zombie_worker import log

#: Five tries in all, a short first wait: the test is about the count, not the delays.
POLICY: Final = RetryPolicy(on=ConnectionError, attempts=5, initial_ms=10, jitter=0)
#: The worker waits for ever (until killed) after this try.
HANG_AFTER: Final = 2


def call_for(workflow: str) -> ToolCall:
    return ToolCall(workflow_id=workflow, tool="psp.charge", args={"order": "o42"})


def options(lease_ms: int) -> RunOptions:
    return RunOptions(
        retry=POLICY,
        stale=StaleOptions(after_ms=lease_ms),
        concurrency=ConcurrencyOptions(
            wait_timeout_ms=60_000, initial_interval_ms=20, max_interval_ms=200
        ),
    )


async def main(url: str, path: str, lease_ms: int, workflow: str) -> NoReturn:
    store = await open_store(url)
    waits = 0

    async def sleep(seconds: float) -> None:
        nonlocal waits
        waits += 1
        log(path, event="backoff", after_try=waits, seconds=seconds)
        if waits == HANG_AFTER:
            await asyncio.Event().wait()  # killed in here
        await asyncio.sleep(seconds)

    ledger = EffectLedger(
        EffectLedgerOptions(
            store=store, defaults=LedgerDefaults(run=options(lease_ms)), sleep=sleep
        )
    )

    async def handler(effect: Effect) -> str:
        log(path, event="try", who="worker", number=effect.tries + 1, attempt=effect.attempt)
        raise ConnectionError("psp unreachable")

    await ledger.run(call_for(workflow), handler)
    raise AssertionError("unreachable: every try fails, and the worker is killed first")


if __name__ == "__main__":
    url, path, lease_ms, workflow = sys.argv[1:5]
    asyncio.run(main(url, path, int(lease_ms), workflow))
