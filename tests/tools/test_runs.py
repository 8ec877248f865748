"""Tool calls run like run(): once, sync or async, replaying results and failures."""

from __future__ import annotations

import asyncio
import threading
from typing import cast

import pytest

from agent_ledger import (
    Effect,
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerValidationError,
    EffectStatus,
    LedgerHooks,
    MemoryStore,
    ToolCall,
)
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness


class BadRequest(Exception):
    code = "bad_request"


async def test_async_tool_runs_once_and_replays_the_stored_json(harness: StoreHarness) -> None:
    """The first call returns the function's own value; a replay the stored JSON."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("geo.locate")
    async def locate(city: str) -> tuple[str, float]:
        runs.append(city)
        return (city, 1.5)

    async with ledger.workflow("w"):
        first = await locate("Oslo")
        again = await locate(city="Oslo")
    assert first == ("Oslo", 1.5)
    assert cast(object, again) == ["Oslo", 1.5]  # a tuple is stored as a JSON array
    assert runs == ["Oslo"]


async def test_sync_tool_runs_in_a_worker_thread(harness: StoreHarness) -> None:
    """A plain function runs off the event loop's thread, once."""
    ledger = harness.ledger()
    threads: list[int] = []

    @ledger.tool("fs.write")
    def write(path: str, *, effect: Effect) -> dict[str, str]:
        threads.append(threading.get_ident())
        return {"path": path, "key": effect.idem_key}

    async with ledger.workflow("w"):
        first = await write("/tmp/x")
        again = await write(path="/tmp/x")
    assert first == again and first["path"] == "/tmp/x"
    assert threads != [threading.get_ident()] and len(threads) == 1


async def test_exception_is_re_raised_and_recorded(harness: StoreHarness) -> None:
    """What the function raised is raised; the failure is the receipt; a replay raises it."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("psp.charge")
    async def charge(amount: int) -> None:
        runs.append(amount)
        raise BadRequest("card declined")

    async with ledger.workflow("w"):
        with pytest.raises(BadRequest, match="card declined"):
            await charge(5)
        with pytest.raises(EffectFailedError) as replay:
            await charge(amount=5)
        effect = await ledger.find_by_idem_key(ledger.idem_key(charge.tool_call(5)))
    assert runs == [5]
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert (replay.value.code, replay.value.message) == ("bad_request", "card declined")


async def test_non_json_result_is_recorded_as_failed() -> None:
    """A result that is not JSON fails the effect, as with run()."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("t")
    async def f(a: int) -> object:
        return object()

    async with ledger.workflow("w"):
        with pytest.raises(EffectLedgerValidationError, match="result"):
            await f(1)


async def test_requires_approval_true_waits_for_a_person(harness: StoreHarness) -> None:
    """requires_approval=True parks the call until approve(), then runs it."""
    ledger = harness.ledger()

    @ledger.tool("deploy", requires_approval=True)
    async def deploy(service: str) -> str:
        return f"deployed {service}"

    async with ledger.workflow("w"):
        key = ledger.idem_key(deploy.tool_call("api"))
        waiting = asyncio.create_task(deploy("api"))
        while not await ledger.pending_approvals():
            await asyncio.sleep(0.01)
    assert await ledger.approve(key, by="ops")
    assert await waiting == "deployed api"


async def test_requires_approval_callable_sees_the_bound_call_and_keeps_ledger_hooks() -> None:
    """A policy gets the ToolCall with bound args; the ledger's notify hook still fires."""
    notified: list[str] = []
    ledger = build_ledger(
        MemoryStore(),
        hooks=LedgerHooks(on_approval_required=lambda effect: notified.append(effect.tool)),
    )
    asked: list[ToolCall] = []

    def big(call: ToolCall) -> bool:
        asked.append(call)
        return call.args["amount"] > 100  # type: ignore[operator]

    @ledger.tool("psp.charge", requires_approval=big)
    async def charge(order_id: str, amount: int = 50) -> int:
        return amount

    async with ledger.workflow("w"):
        assert await charge("o1") == 50
        key = ledger.idem_key(charge.tool_call("o2", 500))
        waiting = asyncio.create_task(charge("o2", amount=500))
        while not await ledger.pending_approvals():
            await asyncio.sleep(0.01)
        assert await ledger.deny(key, reason="too big")
        with pytest.raises(EffectDeniedError, match="too big"):
            await waiting
    assert [c.args for c in asked] == [
        {"order_id": "o1", "amount": 50},
        {"order_id": "o2", "amount": 500},
    ]
    assert notified == ["psp.charge"]


async def test_an_approved_effect_runs_the_args_that_were_approved(
    harness: StoreHarness,
) -> None:
    """A caller with the same key but other values outside it, claiming the approved
    effect, runs the recorded request, not its own values."""
    from agent_ledger import ApprovalPendingError, RunOptions

    ledger = harness.ledger()
    charged: list[tuple[int, str]] = []

    @ledger.tool(
        "payments.charge",
        idempotency_keys=["order"],
        requires_approval=True,
        run_options=RunOptions(wait_for_approval=False),
    )
    async def charge(order: str, amount: int, currency: str = "EUR") -> str:
        charged.append((amount, currency))
        return f"{amount} {currency}"

    async with ledger.workflow("w"):
        with pytest.raises(ApprovalPendingError) as pending:
            await charge("o1", 15_000)
        assert await ledger.approve(pending.value.idem_key, by="ops")
        result = await charge("o1", 15_000, currency="USD")
    assert charged == [(15_000, "EUR")]
    assert result == "15000 EUR"
