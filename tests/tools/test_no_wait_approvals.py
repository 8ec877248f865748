"""wait_for_approval=False: raise ApprovalPendingError instead of waiting for a person."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectDeniedError,
    EffectLedgerValidationError,
    EffectStatus,
    RunOptions,
    ToolCall,
)
from tests.harness import StoreHarness

NO_WAIT = RunOptions(wait_for_approval=False)


async def test_pending_approval_raises_at_once_and_stays_pending(harness: StoreHarness) -> None:
    """First call creates the effect pending; every call until a decision raises, runs nothing."""
    ledger = harness.ledger()
    runs: list[int] = []
    call = ToolCall(workflow_id="w", tool="payments.charge", args={"amount": 5})

    async def handler(_: object) -> str:
        runs.append(1)
        return "charged"

    opts = RunOptions(requires_approval=True, wait_for_approval=False)
    for _ in range(3):
        with pytest.raises(ApprovalPendingError) as caught:
            await asyncio.wait_for(ledger.run(call, handler, opts), 5)
        assert caught.value.idem_key == ledger.idem_key(call)
        assert caught.value.effect.status is EffectStatus.REQUIRES_APPROVAL
    stored = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert stored is not None and stored.status is EffectStatus.REQUIRES_APPROVAL
    assert runs == []

    assert await ledger.approve(ledger.idem_key(call), by="ops")
    assert await ledger.run(call, handler, NO_WAIT) == "charged"
    assert await ledger.run(call, handler, NO_WAIT) == "charged"
    assert runs == [1]


async def test_denied_after_pending_raises_denied(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[int] = []
    call = ToolCall(workflow_id="w", tool="deploy", args={})

    def handler(_: object) -> None:
        runs.append(1)

    opts = RunOptions(requires_approval=True, wait_for_approval=False)
    with pytest.raises(ApprovalPendingError):
        await ledger.run(call, handler, opts)
    assert await ledger.deny(ledger.idem_key(call), reason="no", by="ops")
    with pytest.raises(EffectDeniedError):
        await ledger.run(call, handler, opts)
    assert runs == []


async def test_begin_also_raises_instead_of_waiting(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    call = ToolCall(workflow_id="w", tool="t", args={})
    opts = RunOptions(requires_approval=True, wait_for_approval=False)
    with pytest.raises(ApprovalPendingError):
        await ledger.begin(call, run_options=opts)


async def test_a_waiting_caller_still_waits_for_a_worker(harness: StoreHarness) -> None:
    """Only approvals are not waited for: a call held by another worker is waited on."""
    ledger = harness.ledger()
    call = ToolCall(workflow_id="w", tool="t", args={})
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(_: object) -> int:
        started.set()
        await release.wait()
        return 7

    first = asyncio.create_task(ledger.run(call, slow))
    await started.wait()
    second = asyncio.create_task(ledger.run(call, slow, NO_WAIT))
    await asyncio.sleep(0.05)
    assert not second.done()
    release.set()
    assert await first == 7
    assert await second == 7


async def test_a_pending_waiter_with_the_default_keeps_waiting(harness: StoreHarness) -> None:
    """wait_for_approval=False in one call does not change another caller's wait."""
    ledger = harness.ledger()
    call = ToolCall(workflow_id="w", tool="t", args={})
    waiting = asyncio.create_task(
        ledger.run(call, lambda _: "done", RunOptions(requires_approval=True))
    )
    while await ledger.find_by_idem_key(ledger.idem_key(call)) is None:
        await asyncio.sleep(0.01)
    with pytest.raises(ApprovalPendingError):
        await ledger.run(call, lambda _: "other", NO_WAIT)
    assert not waiting.done()
    assert await ledger.approve(ledger.idem_key(call))
    assert await asyncio.wait_for(waiting, 10) == "done"


def test_wait_for_approval_must_be_a_bool() -> None:
    with pytest.raises(EffectLedgerValidationError, match="wait_for_approval"):
        RunOptions(wait_for_approval="no")  # type: ignore[arg-type]


async def test_tool_invoke_with_call_id_and_no_wait(harness: StoreHarness) -> None:
    """Tool.invoke: args by name, call_id recorded (not keyed), options merged over the tool's."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("pay", requires_approval=True)
    async def pay(order: str, amount: int = 1, /) -> str:
        runs.append(amount)
        return f"{order}:{amount}"

    async with ledger.workflow("w"):
        with pytest.raises(ApprovalPendingError) as caught:
            await pay.invoke({"order": "o1"}, call_id="call_1", run_options=NO_WAIT)
        key = caught.value.idem_key
        assert key == ledger.idem_key(pay.tool_call("o1", 1))
        stored = await ledger.find_by_idem_key(key)
        assert stored is not None and stored.call_id == "call_1"
        assert await ledger.approve(key)
        assert await pay.invoke({"order": "o1", "amount": 1}, call_id="call_2") == "o1:1"
        assert await pay("o1") == "o1:1"
    assert runs == [1]
    with pytest.raises(EffectLedgerValidationError):
        await pay.invoke(["o1"])  # type: ignore[arg-type]
