"""A worker that runs a slice of order sagas and SIGKILLs itself at one chosen point.

`python -m tests.reliability.saga_crash_worker URL LOG FIRST COUNT CRASH_AT POINT`

Saga i charges (undone by a refund), reserves (undone by a release, also
after a failure: ``compensate_if="attempted"``) and ships; shipping fails for
odd i, so odd sagas roll back. At saga CRASH_AT the worker dies at POINT:
`forward` (inside the reservation, after its side effect), `before-undo`
(the saga marked compensating, nothing undone) or `undo` (inside the refund,
after the provider recorded it). With CRASH_AT = -1 it recovers instead:
recover_sagas() until no saga is open. Every side effect goes to a fake
provider in LOG that records each idempotency key once, as a real one
honouring keys would, and every handler call is logged too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from datetime import timedelta
from typing import Any, NoReturn

import orjson

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    RetryPolicy,
    RunOptions,
    open_store,
)
from agent_ledger.options import StaleOptions
from agent_ledger.sagas import SagaFailed, SagaStatus
from agent_ledger.sagas._saga import saga_store

LEASE_MS = 500


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")


def log(path: str, **record: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, orjson.dumps({"pid": os.getpid(), **record}) + b"\n")
    finally:
        os.close(fd)


def saga_id(i: int) -> str:
    return f"order-{i}"


def build(ledger: EffectLedger, path: str, crash: dict[str, int]) -> None:
    def side_effect(kind: str, effect: Effect, i: object) -> None:
        log(path, event="handler", kind=kind, key=effect.idem_key, i=i)
        log(path, event="provider", kind=kind, key=effect.idem_key, i=i)

    @ledger.tool("charge", compensate="refund")
    async def charge(i: int, *, effect: Effect) -> str:
        side_effect("charge", effect, i)
        return f"ch_{i}"

    @ledger.tool("refund", retry=RetryPolicy(on=ConnectionError, initial_ms=1))
    async def refund(forward: Effect, *, effect: Effect) -> str:
        i = forward.args["i"]
        side_effect("refund", effect, i)
        if crash.get("undo") == i:
            die()
        return "refunded"

    @ledger.tool("reserve", compensate="release", compensate_if="attempted")
    async def reserve(i: int, *, effect: Effect) -> str:
        side_effect("reserve", effect, i)
        if crash.get("forward") == i:
            die()
        return f"r_{i}"

    @ledger.tool("release")
    async def release(forward: Effect, *, effect: Effect) -> str:
        side_effect("release", effect, forward.args["i"])
        return "released"

    @ledger.tool("ship")
    async def ship(i: int) -> str:
        if i % 2:
            raise RuntimeError("no courier")
        return "shipped"


async def order(ledger: EffectLedger, i: int) -> None:
    async with ledger.saga(saga_id(i), lease_ms=LEASE_MS, abandon_after=timedelta(0)):
        await ledger.tools["charge"](i)
        await ledger.tools["reserve"](i)
        await ledger.tools["ship"](i)


async def main(url: str, path: str, first: int, count: int, crash_at: int, point: str) -> None:
    store = await open_store(url)
    stale = RunOptions(stale=StaleOptions(after_ms=LEASE_MS))
    ledger = EffectLedger(EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=stale)))
    crash = {point: crash_at} if crash_at >= 0 else {}
    build(ledger, path, crash)
    sagas = saga_store(ledger)
    if crash_at < 0:
        open_ = frozenset({SagaStatus.RUNNING, SagaStatus.COMPENSATING})
        for _ in range(600):
            report = await ledger.recover_sagas(lease_ms=LEASE_MS, limit=1000)
            assert report.errors == [], report.errors
            if not await sagas.list_sagas(statuses=open_, limit=1):
                break
            await asyncio.sleep(0.05)
        await store.close()
        return
    if point == "before-undo":
        moves = sagas.finish_saga

        async def finish_then_die(saga_id_: str, **kw: Any) -> bool:
            moved = await moves(saga_id_, **kw)
            if saga_id_ == saga_id(crash_at) and kw["then"] is SagaStatus.COMPENSATING:
                die()
            return moved

        sagas.finish_saga = finish_then_die  # type: ignore[method-assign,assignment]
    for i in range(first, first + count):
        with contextlib.suppress(SagaFailed):  # odd sagas roll back
            await order(ledger, i)
    await store.close()


if __name__ == "__main__":
    url, path, first, count, crash_at, point = sys.argv[1:7]
    asyncio.run(main(url, path, int(first), int(count), int(crash_at), point))
