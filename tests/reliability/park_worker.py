"""A worker running one call of an ``on_stale="park"`` tool, SIGKILLed at a chosen point.

`python -m tests.reliability.park_worker URL PROVIDER_LOG ORDER POINT AFTER_MS`

The tool ``payments.charge`` charges a fake provider: each charge is one line
(``pid attempt``) appended to PROVIDER_LOG, flushed, before the handler
returns. POINT:

* ``inside``: die inside the handler, right after the charge (the ambiguous case);
* ``before``: die once the run holds the effect, before its handler's start
  is recorded (nothing can have happened);
* ``none``: a caller; print the outcome as a JSON line and exit 0.
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
    EffectDeniedError,
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    RunOptions,
    open_store,
)
from agent_ledger.options import StaleOptions
from agent_ledger.stores.base import Store
from agent_ledger.testing import FaultyStore


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")


def charge_line(path: str, attempt: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, f"{os.getpid()} {attempt}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def main(url: str, provider: str, order: str, point: str, after_ms: int) -> None:
    store: FaultyStore[Store] = FaultyStore(await open_store(url))
    ledger = EffectLedger(
        EffectLedgerOptions(
            store=store,
            defaults=LedgerDefaults(run=RunOptions(stale=StaleOptions(after_ms=after_ms))),
        )
    )
    if point == "before":
        store.fail("mark_started", when="before", error=die)

    @ledger.tool("payments.charge", workflow_id="shop", on_stale="park")
    async def charge(order: str, *, effect: Effect) -> dict[str, Any]:
        charge_line(provider, effect.attempt)
        if point == "inside":
            die()
        return {"order": order, "charge": f"ch_{effect.attempt}", "by": os.getpid()}

    try:
        outcome: dict[str, Any] = {"result": await charge(order)}
    except EffectDeniedError as exc:
        outcome = {"denied": exc.reason}
    print(orjson.dumps(outcome).decode(), flush=True)
    await store.close()


if __name__ == "__main__":
    url, provider, order, point, after_ms = sys.argv[1:6]
    asyncio.run(main(url, provider, order, point, int(after_ms)))
