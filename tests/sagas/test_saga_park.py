"""A parked step parks its saga (every store): the saga stays running, shows the
parked step, and goes on once a person settles it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_ledger import Effect, EffectLedger, EffectStatus, RunOptions
from agent_ledger.options import StaleOptions
from agent_ledger.sagas import SagaFailed, SagaStatus
from agent_ledger.sagas._outcome import read_outcome
from agent_ledger.sagas._report import render_saga, sagas_table
from agent_ledger.sagas._saga import saga_store
from tests.harness import StoreHarness
from tests.sagas.conftest import owner_dies, shop_of


@pytest.mark.parametrize("decision", ["resolve", "deny"])
async def test_a_parked_step_parks_its_saga_until_settled(
    harness: StoreHarness, decision: str
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s3")
    started, wake = asyncio.Event(), asyncio.Event()
    charges: list[str] = []

    @ledger.tool("pay", on_stale="park", run_options=RunOptions(stale=StaleOptions(after_ms=3_000)))
    async def pay(order: str) -> dict[str, str]:
        charges.append(order)
        started.set()
        await wake.wait()  # the worker stalls past its lease, then comes back
        return {"charge": "ch_worker"}

    async def saga_code() -> object:
        async with ledger.saga("order-9"):
            await shop["s1"]("o9")
            paid = await pay("o9")
            await shop["s3"]("o9")
            return paid

    running = asyncio.create_task(saga_code())
    await started.wait()
    await harness.age(60_000)
    (parked,) = await ledger.park_stale()
    store = saga_store(ledger)
    saga = await store.get_saga("order-9")
    assert saga is not None and saga.status is SagaStatus.RUNNING
    outcome = await read_outcome(ledger, store, saga)
    assert outcome.parked == ("step 1 pay (forward)",)
    assert "parked step 1 pay (forward)" in "\n".join(
        sagas_table([saga], {"order-9": outcome.parked})
    )
    assert "waits for a person" in render_saga(outcome)
    assert not running.done()

    if decision == "resolve":
        assert await ledger.resolve(
            parked.idem_key, result={"charge": "ch_provider"}, by="ops", expected_attempt=1
        )
        wake.set()  # the stalled worker's late commit is refused: the receipt stands
        assert await asyncio.wait_for(running, 10) == {"charge": "ch_provider"}
        assert shop.log == ["s1", "s3"]
        final = await store.get_saga("order-9")
        assert final is not None and final.status is SagaStatus.COMPLETED
    else:
        assert await ledger.deny(parked.idem_key, reason="never charged; cancel the order")
        wake.set()
        with pytest.raises(SagaFailed) as failed:
            await asyncio.wait_for(running, 10)
        assert failed.value.outcome.status is SagaStatus.COMPENSATED
        assert shop.log == ["s1", "undo s1"]
    assert charges == ["o9"]


async def test_a_rollback_waits_for_a_parked_step_then_undoes_what_happened(
    harness: StoreHarness,
) -> None:
    """A rollback never cancels a parked step: it waits (the saga stays compensating),
    and once the step is resolved as having happened, undoes it like any success."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1")
    started, wake = asyncio.Event(), asyncio.Event()
    undone: list[object] = []

    @ledger.tool(
        "pay",
        on_stale="park",
        compensate="refund",
        run_options=RunOptions(stale=StaleOptions(after_ms=3_000)),
    )
    async def pay(order: str) -> dict[str, str]:
        started.set()
        await wake.wait()
        return {"charge": "ch_worker"}

    @ledger.tool("refund")
    async def refund(forward: object) -> str:
        undone.append(forward)
        return "refunded"

    async def saga_code() -> None:
        async with ledger.saga("order-10") as saga:
            await shop["s1"]("o10")
            saga.start(pay, "o10")
            await started.wait()
            raise RuntimeError("the customer cancelled the order")

    running = asyncio.create_task(saga_code())
    await started.wait()
    await harness.age(60_000)
    (parked,) = await ledger.park_stale()
    store = saga_store(ledger)
    saga = None
    for _ in range(200):  # the rollback starts and waits on the parked step
        saga = await store.get_saga("order-10")
        if saga is not None and saga.status is SagaStatus.COMPENSATING:
            break
        await asyncio.sleep(0.01)
    assert saga is not None and saga.status is SagaStatus.COMPENSATING
    await asyncio.sleep(0.2)
    still = await ledger.find_by_idem_key(parked.idem_key)
    assert still is not None and still.parked  # not canceled by the rollback
    assert (await read_outcome(ledger, store, saga)).parked == ("step 1 pay (forward)",)
    assert await ledger.resolve(parked.idem_key, result={"charge": "ch_provider"}, by="ops")
    wake.set()
    with pytest.raises(SagaFailed) as failed:
        await asyncio.wait_for(running, 10)
    assert failed.value.outcome.status is SagaStatus.COMPENSATED
    assert len(undone) == 1 and shop.log == ["s1", "undo s1"]


async def test_a_recovery_pass_reports_a_parked_step_and_moves_on(harness: StoreHarness) -> None:
    """A pass finishing a dead owner's undo does not wait for a person: a parked step
    stops that saga's undo (reported in errors, the saga stays compensating) while the
    pass goes on; once the step is settled, the next pass finishes it."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1")
    started = asyncio.Event()
    refunds: list[object] = []

    @ledger.tool(
        "pay",
        on_stale="park",
        compensate="refund",
        run_options=RunOptions(stale=StaleOptions(after_ms=1_000)),
    )
    async def pay(order: str) -> dict[str, str]:
        started.set()
        await asyncio.Event().wait()  # the worker dies inside the handler
        return {"charge": "never"}

    @ledger.tool("refund")
    async def refund(forward: object) -> str:
        refunds.append(forward)
        return "refunded"

    saga = ledger.saga("order-11", lease_ms=1_000)
    await saga.__aenter__()
    await shop["s1"]("o11")
    stuck = saga.start(pay, "o11")
    await started.wait()
    store = saga_store(ledger)
    assert await store.finish_saga(
        "order-11", attempt=1, expect=SagaStatus.RUNNING, then=SagaStatus.COMPENSATING, error=None
    )
    await owner_dies(saga, ledger)  # its handler stalled for good
    await harness.age(5_000)
    (parked,) = await ledger.park_stale()

    report = await asyncio.wait_for(ledger.recover_sagas(), 10)
    assert report.finished == []
    ((saga_id, why),) = report.errors
    assert saga_id == "order-11" and "SagaStepParked" in why and "parked for a person" in why
    left = await store.get_saga("order-11")
    assert left is not None and left.status is SagaStatus.COMPENSATING
    assert refunds == [] and shop.log == ["s1"]

    assert await ledger.resolve(parked.idem_key, result={"charge": "ch_1"}, by="ops")
    await harness.age(60_000)  # the first pass's claim (its default lease) ran out
    report = await asyncio.wait_for(ledger.recover_sagas(), 10)
    assert [o.status for o in report.finished] == [SagaStatus.COMPENSATED]
    assert len(refunds) == 1 and shop.log == ["s1", "undo s1"]
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)


async def _rollback_stalled_in_refund(
    harness: StoreHarness, saga_id: str, refund_options: dict[str, Any], wake: asyncio.Event
) -> tuple[EffectLedger, asyncio.Task[object], list[str]]:
    """A saga whose rollback's refund stalls mid-handler (until ``wake``) while its
    owner stops heartbeating, or waits for the refund's approval and dies."""
    ledger = harness.ledger()
    refund_started = asyncio.Event()
    refunds: list[str] = []

    @ledger.tool("pay", compensate="refund")
    async def pay(order: str) -> dict[str, str]:
        return {"charge": f"ch_{order}"}

    @ledger.tool("refund", **refund_options)
    async def refund(forward: Effect) -> str:
        refunds.append(forward.idem_key)
        refund_started.set()
        if refund_options.get("on_stale") == "park" and len(refunds) == 1:
            await wake.wait()  # the first refund's worker stalls inside it
        return "refunded"

    saga = ledger.saga(saga_id, lease_ms=1_000)

    async def saga_code() -> object:
        async with saga:
            await pay("o12")
            raise RuntimeError("shipping failed")

    stuck = asyncio.create_task(saga_code())
    if refund_options.get("on_stale") == "park":
        await refund_started.wait()
        await owner_dies(saga, ledger)  # mid-refund
        await harness.age(5_000)
        (parked,) = await ledger.park_stale()
        assert parked.tool == "refund"
    else:
        for _ in range(500):  # the rollback waits for the refund's approval
            pending = (await ledger.list_effects(status=EffectStatus.REQUIRES_APPROVAL)).effects
            if pending:
                break
            await asyncio.sleep(0.01)
        assert saga._heartbeat is not None
        saga._heartbeat.stop()  # the owner dies while waiting for a person
        # A renewal already in flight when it stopped lands first (on a real
        # server it takes a round trip); only then does its lease age out.
        await asyncio.sleep(0.2)
        await harness.age(5_000)
    return ledger, stuck, refunds


@pytest.mark.parametrize(
    ("why", "decision"), [("parked", "resolve"), ("parked", "deny"), ("approval", "approve")]
)
async def test_a_recovery_pass_moves_on_past_a_compensation_waiting_for_a_person(
    harness: StoreHarness, why: str, decision: str
) -> None:
    """The undo itself waits for a person (parked mid-refund, or the refund tool's
    approval policy): a recovery pass reports that saga and moves on instead of
    waiting; once the refund is settled, the next pass finishes the saga, and a
    parked refund never runs again."""
    options: dict[str, Any] = (
        {"on_stale": "park", "run_options": RunOptions(stale=StaleOptions(after_ms=1_000))}
        if why == "parked"
        else {"requires_approval": True}
    )
    wake = asyncio.Event()
    ledger, stuck, refunds = await _rollback_stalled_in_refund(harness, "order-12", options, wake)
    store = saga_store(ledger)

    report = await asyncio.wait_for(ledger.recover_sagas(), 10)
    assert report.finished == []
    ((saga_id, why_not),) = report.errors
    assert saga_id == "order-12" and "SagaStepParked" in why_not
    assert "compensation of step 0 (refund" in why_not
    assert ("parked for a person" if why == "parked" else "approval") in why_not
    left = await store.get_saga("order-12")
    assert left is not None and left.status is SagaStatus.COMPENSATING

    (waiting,) = (await ledger.list_effects(status=EffectStatus.REQUIRES_APPROVAL)).effects
    if decision == "resolve":
        assert await ledger.resolve(waiting.idem_key, result="refunded by hand", by="ops")
    elif decision == "deny":
        assert await ledger.deny(waiting.idem_key, reason="not refunded: do it by hand", by="ops")
    else:
        assert await ledger.approve(waiting.idem_key, by="ops")
    await harness.age(60_000)  # the first pass's claim ran out
    report = await asyncio.wait_for(ledger.recover_sagas(), 10)
    ended = SagaStatus.COMPENSATION_FAILED if decision == "deny" else SagaStatus.COMPENSATED
    assert [o.status for o in report.finished] == [ended]
    assert len(refunds) == 1  # parked: resolved, never re-run; approval: run once now
    # The stalled refund's worker comes back: its late commit is refused. (With an
    # approval, the old owner's shielded rollback and the pass raced for the
    # approved refund: one ran it.)
    wake.set()
    await asyncio.wait_for(asyncio.gather(stuck, return_exceptions=True), 10)
    assert len(refunds) == 1
    (refund,) = (await ledger.list_effects(tool="refund")).effects
    assert refund.executions == 1
    if decision == "deny":
        assert refund.status is EffectStatus.DENIED
    else:
        assert refund.status is EffectStatus.SUCCEEDED
    if decision == "resolve":
        assert refund.result == "refunded by hand"
