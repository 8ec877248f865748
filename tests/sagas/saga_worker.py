"""A worker process for the saga crash tests.

`python -m tests.sagas.saga_worker URL LOG DOWNSTREAM MODE [CRASH]`

MODE `run` runs the order saga (charge succeeds, reserve fails, so the charge
is refunded), dying by SIGKILL at CRASH: `before-undo` (the saga is marked
compensating, nothing is undone yet) or `inside-undo` (the refund reached the
downstream, its effect is not committed). `recover` calls recover_sagas()
until the saga has ended; `rerun` runs the saga code again. Each handler call
is appended to LOG, and the fake payment provider at DOWNSTREAM records one
refund per idempotency key, as a real one honouring the key would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
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
from agent_ledger.sagas import SagaFailed, SagaInFlightError, SagaStatus
from agent_ledger.sagas._saga import saga_store

SAGA_ID = "order-42"
LEASE_MS = 600


def die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")


def append(path: str, **record: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, orjson.dumps({"pid": os.getpid(), **record}) + b"\n")
    finally:
        os.close(fd)


def refund_once(downstream: str, key: str) -> None:
    """The payment provider: a refund whose idempotency key it has seen is not repeated."""
    seen = Path(downstream)
    if seen.exists() and any(orjson.loads(x)["key"] == key for x in seen.read_text().split()):
        return
    append(downstream, key=key)


class Declined(Exception):
    code = "declined"


def build(ledger: EffectLedger, log: str, downstream: str, crash: str) -> None:
    @ledger.tool("payments.charge", compensate="payments.refund")
    async def charge(order_id: str, amount: int) -> dict[str, object]:
        append(log, event="charge")
        return {"charge_id": f"ch_{order_id}"}

    @ledger.tool("payments.refund", retry=RetryPolicy(on=ConnectionError, initial_ms=1))
    async def refund(forward: Effect, *, effect: Effect) -> str:
        append(log, event="refund", key=effect.idem_key, attempt=effect.attempt)
        refund_once(downstream, effect.idem_key)
        if crash == "inside-undo":
            die()
        assert isinstance(forward.result, dict)
        return f"refunded {forward.result['charge_id']}"

    @ledger.tool("inventory.reserve", compensate="inventory.release")
    async def reserve(sku: str) -> None:
        append(log, event="reserve")
        raise Declined("out of stock")

    @ledger.tool("inventory.release")
    async def release(forward: Effect) -> None:
        append(log, event="release")


async def order(ledger: EffectLedger) -> None:
    async with ledger.saga(SAGA_ID, lease_ms=LEASE_MS):
        await ledger.tools["payments.charge"]("o42", 4999)
        await ledger.tools["inventory.reserve"]("A")


async def main(url: str, log: str, downstream: str, mode: str, crash: str) -> None:
    store = await open_store(url)
    stale = RunOptions(stale=StaleOptions(after_ms=LEASE_MS))
    ledger = EffectLedger(EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=stale)))
    build(ledger, log, downstream, crash)
    sagas = saga_store(ledger)
    if crash == "before-undo":
        moves = sagas.finish_saga

        async def finish_then_die(saga_id: str, **kw: Any) -> bool:
            moved = await moves(saga_id, **kw)
            if kw["then"] is SagaStatus.COMPENSATING:
                die()
            return moved

        sagas.finish_saga = finish_then_die  # type: ignore[method-assign]
    status = None
    if mode in ("run", "rerun"):
        for _ in range(400):
            try:
                await order(ledger)
            except SagaInFlightError:
                await asyncio.sleep(0.05)  # the dead owner's lease has not run out yet
                continue
            except SagaFailed as failed:
                status = failed.status.value
            break
    else:
        for _ in range(400):
            report = await ledger.recover_sagas(lease_ms=LEASE_MS)
            saga = await sagas.get_saga(SAGA_ID)
            assert saga is not None
            if saga.status.is_terminal:
                status = saga.status.value
                break
            assert report.errors == [], report.errors
            await asyncio.sleep(0.05)
    print(orjson.dumps({"status": status}).decode())
    await store.close()


if __name__ == "__main__":
    url, log, downstream, mode, *rest = sys.argv[1:]
    asyncio.run(main(url, log, downstream, mode, rest[0] if rest else "none"))
