"""The demo: an agent retries a payment tool five times; the card is charged once.

It also asks for a refund that policy sends to a person: the first run leaves
it pending, and once someone runs ``agent-ledger approve``, the next run
executes it.

Run it with ``python -m agent_ledger demo``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import orjson

from agent_ledger.calls import ToolCall
from agent_ledger.effects import Effect
from agent_ledger.errors import EffectDeniedError, EffectTimeoutError
from agent_ledger.ledger import EffectLedger
from agent_ledger.options import ConcurrencyOptions, EffectLedgerOptions, RunOptions
from agent_ledger.receipt import render_receipt
from agent_ledger.stores.base import Store

RETRIES = 5


class FakePaymentAPI:
    """Stands in for a payment provider: every call to ``charge`` is a real charge."""

    def __init__(self) -> None:
        self.charges: list[dict[str, object]] = []
        self.refunds = 0
        self._ids = itertools.count(1)

    async def charge(self, amount_cents: int, currency: str) -> dict[str, object]:
        charge = {
            "charge_id": f"ch_{next(self._ids):04d}",
            "amount": amount_cents,
            "currency": currency,
        }
        self.charges.append(charge)
        return charge


async def run_demo(store: Store, emit: Callable[[str], None] = print) -> FakePaymentAPI:
    """Play the agent: the same tool call, retried, through one ledger."""
    api = FakePaymentAPI()
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    call = ToolCall(
        workflow_id="order-1042",
        tool="payments.charge",
        args={"amount_cents": 4_999, "currency": "eur", "customer": "cus_77"},
        call_id="llm-call-1",
    )

    async def charge(effect: Effect) -> dict[str, object]:
        return await api.charge(4_999, "eur")

    earlier = await ledger.find_by_idem_key(ledger.idem_key(call))
    emit(f"An agent calls payments.charge {RETRIES} times (it keeps retrying after timeouts):")
    if earlier is not None:
        emit("  (a receipt from an earlier run is already in the store)")
    for attempt in range(1, RETRIES + 1):
        before = len(api.charges)
        result = await ledger.run(call, charge)
        what = "charged the card" if len(api.charges) > before else "replayed the receipt"
        emit(f"  try {attempt}: {what:<22} -> {result['charge_id']}")
    if api.charges:
        times = "once" if len(api.charges) == 1 else f"{len(api.charges)} times"
        emit(f"\nThe payment API was charged {times} for {RETRIES} tries.\n")
    else:
        emit(
            f"\nThe payment API was not charged at all for {RETRIES} tries: "
            "the earlier run's receipt answered them.\n"
        )
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None
    emit("Receipt:")
    emit(render_receipt(effect))
    await _refund(ledger, api, effect, emit)
    return api


async def _refund(
    ledger: EffectLedger, api: FakePaymentAPI, charge: Effect, emit: Callable[[str], None]
) -> None:
    """A refund needs a human: the first run leaves it pending, a later one runs it."""
    charge_id = charge.result["charge_id"] if isinstance(charge.result, dict) else None
    refund = ToolCall(
        workflow_id="order-1042",
        tool="payments.refund",
        args={"charge_id": charge_id, "amount_cents": 4_999},
    )

    async def do_refund(effect: Effect) -> dict[str, object]:
        api.refunds += 1
        return {"refund_id": "re_0001", "charge_id": charge_id}

    emit("\nThe agent also asks to refund the order; policy says a person decides.")
    # approval_timeout_ms=0: record the request and return at once instead of waiting.
    no_wait = RunOptions(
        requires_approval=True, concurrency=ConcurrencyOptions(approval_timeout_ms=0)
    )
    key = ledger.idem_key(refund)[:12]
    try:
        result = await ledger.run(refund, do_refund, no_wait)
    except EffectTimeoutError:
        emit(f"  waiting for approval: agent-ledger approve {key}   (or: agent-ledger deny {key})")
    except EffectDeniedError as exc:
        emit(f"  denied: {exc.reason}")
    else:
        emit(f"  approved, so it ran: {orjson.dumps(result).decode()}")


async def run_saga_demo(store: Store, emit: Callable[[str], None] = print) -> list[str]:
    """A saga rolls back: payment and reservation succeed, shipping fails, so the
    reservation is released and the payment refunded, in that order. A second run
    finds the saga rolled back and runs nothing. Returns what the fake services did."""
    from agent_ledger.sagas import SagaFailed
    from agent_ledger.sagas._report import render_saga

    ledger = EffectLedger(EffectLedgerOptions(store=store))
    done: list[str] = []

    @ledger.tool("payments.charge", compensate="payments.refund")
    async def charge(order_id: str, amount_cents: int) -> dict[str, object]:
        done.append("charged")
        return {"charge_id": "ch_2077", "amount": amount_cents}

    @ledger.tool("payments.refund")
    async def refund(forward: Effect) -> dict[str, object]:
        done.append("refunded")
        return {"refund_id": "re_2077", "charge_id": _field(forward, "charge_id")}

    @ledger.tool("inventory.reserve", compensate="inventory.release")
    async def reserve(sku: str, qty: int) -> dict[str, object]:
        done.append("reserved")
        return {"reservation": "rsv_9", "sku": sku, "qty": qty}

    @ledger.tool("inventory.release")
    async def release(forward: Effect) -> dict[str, object]:
        done.append("released")
        return {"released": _field(forward, "reservation")}

    @ledger.tool("shipping.book")
    async def ship(order_id: str) -> None:
        done.append("shipping failed")
        raise RuntimeError("no courier serves this address")

    emit("An agent runs the order saga: charge, reserve stock, book shipping.")
    try:
        async with ledger.saga("order-2077"):
            await charge("o2077", 12_900)
            await reserve("sku-42", 1)
            await ship("o2077")
    except SagaFailed as failed:
        if done:
            emit(f"  what the services saw: {', '.join(done)}")
        else:
            emit("  (an earlier run already rolled it back: nothing runs again)")
        emit(f"\nThe saga was {failed.status.value}: the undo ran in reverse order.\n")
        emit(render_saga(failed.outcome))
    return done


def _field(effect: Effect, name: str) -> object:
    return effect.result.get(name) if isinstance(effect.result, dict) else None
