"""A worker that the zombie test freezes (SIGSTOP) inside its handler and thaws later.

`python -m tests.reliability.zombie_worker URL LOG RELEASE LEASE_MS WORKFLOW`

It runs one call (``call_for(WORKFLOW)``). The handler appends an ``executed`` record
to LOG, then waits until the file RELEASE exists before it returns, so the
test decides when the handler ends. Every heartbeat and commit the worker
sends is appended to LOG with the store's answer (``alive``, ``won``); the
outcome ``run()`` returned is printed as the last line of stdout.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from agent_ledger import (
    Effect,
    EffectError,
    EffectLedgerError,
    EffectStatus,
    RunOptions,
    ToolCall,
    open_store,
)
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.stores.base import HeartbeatOutcome, Held, Store
from agent_ledger.testing import FaultyStore, build_ledger


def call_for(workflow: str) -> ToolCall:
    return ToolCall(workflow_id=workflow, tool="payment.charge", args={"amount": 42})


def log(path: str, **record: Any) -> None:
    """Append one JSON record to ``path`` in a single write (O_APPEND: never interleaved)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, orjson.dumps({"pid": os.getpid(), **record}) + b"\n")
    finally:
        os.close(fd)


def options(lease_ms: int) -> RunOptions:
    return RunOptions(
        stale=StaleOptions(after_ms=lease_ms),
        concurrency=ConcurrencyOptions(
            wait_timeout_ms=60_000, initial_interval_ms=20, max_interval_ms=200
        ),
    )


class Recorded(FaultyStore[Store]):
    """Forwards everything; logs each heartbeat and commit with the store's answer."""

    def __init__(self, inner: Store, path: str) -> None:
        super().__init__(inner)
        self.path = path

    async def heartbeat(self, held: Sequence[Held]) -> HeartbeatOutcome:
        outcome = await super().heartbeat(held)
        for beat in held:
            alive = beat in outcome.refreshed or beat in outcome.busy
            log(self.path, event="heartbeat", attempt=beat.attempt, alive=alive)
        return outcome

    async def commit(
        self,
        effect_id: str,
        *,
        attempt: int | None,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None = None,
        ends_try: bool = True,
        usage_json: str | None = None,
        started: bool = True,
        retryable: bool = False,
    ) -> bool:
        won = await super().commit(
            effect_id,
            attempt=attempt,
            status=status,
            result_json=result_json,
            error=error,
            tx=tx,
            ends_try=ends_try,
            usage_json=usage_json,
            started=started,
            retryable=retryable,
        )
        log(self.path, event="commit", attempt=attempt, won=won)
        return won


async def main(url: str, path: str, release: str, lease_ms: int, workflow: str) -> None:
    store = Recorded(await open_store(url), path)
    ledger = build_ledger(store, defaults=options(lease_ms))

    async def handler(effect: Effect) -> dict[str, Any]:
        log(path, event="executed", who="zombie", attempt=effect.attempt)
        while not Path(release).exists():
            await asyncio.sleep(0.01)
        return {"by": "zombie", "attempt": effect.attempt}

    try:
        outcome: dict[str, Any] = {"result": await ledger.run(call_for(workflow), handler)}
    except EffectLedgerError as exc:
        outcome = {"error": type(exc).__name__, "text": str(exc)}
    finally:
        await store.close()
    print(orjson.dumps(outcome).decode(), flush=True)


if __name__ == "__main__":
    url, path, release, lease_ms, workflow = sys.argv[1:6]
    asyncio.run(main(url, path, release, int(lease_ms), workflow))
