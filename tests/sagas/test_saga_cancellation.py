"""A saga cancelled at any point ends cancelled or compensated, never running: its task,
its entry, a step whose error is coded `canceled`, and a step approved while the
rollback cancels it; and a saga's heartbeat stops at once. Every store through the harness."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_ledger import (
    Effect,
    EffectStatus,
)
from agent_ledger.engine.heartbeats import Beat
from agent_ledger.sagas import (
    Saga,
    SagaFailed,
    SagaStatus,
)
from agent_ledger.sagas._saga import keep_alive, saga_store
from agent_ledger.stores.saga_base import NewSaga
from tests.harness import StoreHarness
from tests.sagas.conftest import shop_of

G = SagaStatus
LEASE = 1_000


async def _status(harness: StoreHarness, saga_id: str) -> SagaStatus | None:
    saga = await saga_store(harness.ledger()).get_saga(saga_id)
    return None if saga is None else saga.status


async def _die(saga: Saga) -> None:
    """The owner stops heartbeating and never returns (as after a SIGKILL)."""
    assert saga._heartbeat is not None
    saga._heartbeat.stop()
    for token in reversed(saga._tokens):
        token.var.reset(token)
    saga._scope.__exit__(None, None, None)


async def test_a_step_approved_while_the_rollback_cancels_it_is_undone(
    harness: StoreHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = harness.ledger()
    log: list[str] = []
    started, finish = asyncio.Event(), asyncio.Event()

    @ledger.tool("wire", compensate="wire.back", requires_approval=True)
    async def wire(amount: int) -> str:
        log.append("wire sent")
        started.set()
        await finish.wait()  # still running when the rollback's cancel lands
        return "w1"

    @ledger.tool("wire.back")
    async def wire_back(forward: Effect) -> str:
        log.append(f"wire reversed {forward.result}")
        return "back"

    @ledger.tool("check")
    async def check() -> None:
        raise RuntimeError("check failed")

    store: Any = harness.store
    transition = store.transition
    raced: list[bool] = []

    async def approve_first(idem_key: str, *, target: EffectStatus, **kw: Any) -> Any:
        # The person approves between the rollback's read and its cancel, and
        # the waiting step claims the effect and runs its handler.
        if target is not EffectStatus.CANCELED or raced:
            return await transition(idem_key, target=target, **kw)
        raced.append(True)
        assert await ledger.approve(idem_key, by="alice")
        await asyncio.wait_for(started.wait(), 30)
        try:
            return await transition(idem_key, target=target, **kw)
        finally:
            finish.set()

    monkeypatch.setattr(store, "transition", approve_first)
    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("approve-race") as saga, saga.parallel():
            saga.start(wire, 100)
            saga.start(check)
    assert raced and failed.value.status is G.COMPENSATED
    assert log == ["wire sent", "wire reversed w1"]
    wire_step = failed.value.outcome.steps[0]
    assert wire_step.forward_status is EffectStatus.SUCCEEDED


async def test_a_saga_heartbeat_stops_at_once_and_tells_when_the_saga_is_no_longer_ours(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    store = saga_store(ledger)
    saga = (await store.begin_saga(NewSaga("hb", "me", 150, None, "continue"))).saga
    beat = keep_alive(ledger, store, saga)
    assert isinstance(beat, Beat)  # the engine's heartbeats keep the saga's owner alive
    await asyncio.sleep(0.12)  # two beats (one every 50 ms) while the saga is ours
    assert not beat.lost
    assert await store.finish_saga(
        "hb", attempt=saga.attempt, expect=G.RUNNING, then=G.COMPLETED, error=None
    )
    for _ in range(200):
        if beat.lost:
            break
        await asyncio.sleep(0.01)
    assert beat.lost, "a heartbeat found the saga no longer ours"
    # Stopping is synchronous: there is no await in it, so a cancellation of
    # the caller arriving meanwhile cannot be swallowed there.
    assert beat.stop() is None


async def test_cancelling_the_saga_task_at_any_await_ends_it_cancelled(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge", "ship")
    # Cancel after k turns of the loop: every await of the block and its exit
    # (where the stores do I/O, which turns land where varies; any is fine).
    for k in range(80):
        after: list[str] = []

        async def code(saga_id: str, after: list[str]) -> None:
            async with ledger.saga(saga_id):
                await shop["charge"]("o")
                await shop["ship"]("o")
            after.append("went on past the block")

        task = asyncio.create_task(code(f"swallow-{k}", after))
        for _ in range(k):
            await asyncio.sleep(0)
        if task.done():
            break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert after == [], k
        assert await _status(harness, f"swallow-{k}") in (None, G.CANCELED, G.COMPLETED), k


async def test_a_cancelled_entry_leaves_no_saga_running(
    harness: StoreHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge")
    store: Any = harness.store
    landed, go_on = asyncio.Event(), asyncio.Event()

    def pausing(step: Any) -> Any:
        async def paused(*args: Any, **kwargs: Any) -> Any:
            result = await step(*args, **kwargs)  # stored: now the saga is ours
            landed.set()
            await go_on.wait()
            return result

        return paused

    # A new saga: begin_saga lands, then the task is cancelled.
    monkeypatch.setattr(store, "begin_saga", pausing(store.begin_saga))
    task = asyncio.create_task(ledger.saga("entry-new").__aenter__())
    await landed.wait()
    task.cancel()
    await asyncio.sleep(0)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _status(harness, "entry-new") is G.CANCELED
    monkeypatch.undo()

    # A saga taken over from a dead owner: claim_saga lands, then the cancel.
    dead = ledger.saga("entry-old", lease_ms=LEASE)
    await dead.__aenter__()
    await shop["charge"]("o")
    await _die(dead)
    await harness.age(LEASE * 2)
    landed.clear()
    go_on.clear()
    monkeypatch.setattr(store, "claim_saga", pausing(store.claim_saga))
    task = asyncio.create_task(ledger.saga("entry-old", lease_ms=LEASE).__aenter__())
    await landed.wait()
    task.cancel()
    await asyncio.sleep(0)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _status(harness, "entry-old") is G.CANCELED
    assert shop.log == ["charge", "undo charge"]


async def test_a_step_error_coded_canceled_ends_the_saga_compensated(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge")

    class OrderCanceled(Exception):
        code = "canceled"

    @ledger.tool("ship")
    async def ship(order: str) -> None:
        raise OrderCanceled("the carrier canceled the pickup")

    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("code-canceled"):
            await shop["charge"]("o")
            await ship("o")
    assert failed.value.status is G.COMPENSATED
    assert failed.value.outcome.error is not None
    assert failed.value.outcome.error.code == "canceled"
    assert await _status(harness, "code-canceled") is G.COMPENSATED
