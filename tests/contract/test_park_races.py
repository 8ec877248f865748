"""Parking under faults and races (every store): a person's settlement is the outcome
every caller gets, a parked effect always pages someone, and a saga's rollback
never cancels a run whose handler just started under ``on_stale="park"``.

Each test here reproduced a defect of the second adversarial pass over parking.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agent_ledger import (
    Effect,
    EffectError,
    EffectFailedError,
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    EffectStatus,
    LedgerHooks,
    RunOptions,
    ToolCall,
)
from agent_ledger.decisions import MAX_ATTEMPT, ambiguous_error
from agent_ledger.errors import ApprovalPendingError, EffectStoreError
from agent_ledger.options import StaleOptions
from agent_ledger.sagas import SagaStatus
from agent_ledger.sagas._saga import saga_store
from agent_ledger.stores.base import ClaimOutcome
from agent_ledger.testing import FaultyStore
from tests.approvals import PARK, make_parked
from tests.harness import StoreHarness
from tests.sagas.conftest import owner_dies

S = EffectStatus
CHARGE = ToolCall(workflow_id="order-7", tool="payments.charge", args={"cents": 500})
#: A long lease: no heartbeat of the worker lands while the test parks it by hand.
LONG_PARK = RunOptions(on_stale="park", stale=StaleOptions(after_ms=30_000))
NO_WAIT = RunOptions(on_stale="park", stale=StaleOptions(after_ms=1_000), wait_for_approval=False)


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
async def test_a_fenced_worker_returns_the_persons_settlement_not_its_own(
    harness: StoreHarness, outcome: str
) -> None:
    """The worker's first commit fails and, while it waits to retry, it is parked and
    a person resolves it: the retried commit is refused, and the read-back must not
    mistake the person's outcome (same attempt, same status) for its own commit."""
    store = FaultyStore(harness.store)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    key = ledger.idem_key(CHARGE)

    async def handler(effect: Effect) -> dict[str, str]:
        # The worker is paused past its lease here: parked, then settled by a person.
        await harness.age(120_000)
        parked = await harness.store.park(key, stale_after_ms=1, error=ambiguous_error())
        assert parked.claimed
        if outcome == "succeeded":
            settled = await ledger.resolve(
                key, result={"charge_id": "ch_operator"}, by="ops", expected_attempt=1
            )
        else:
            error = EffectError("the provider declined it", "card_declined")
            settled = await ledger.resolve(key, error=error, by="ops", expected_attempt=1)
        assert settled
        store.fail("commit")  # the worker's commit then hits a dropped connection
        if outcome == "succeeded":
            return {"charge_id": "ch_worker"}
        raise RuntimeError("the worker's own failure")

    if outcome == "succeeded":
        assert await ledger.run(CHARGE, handler, LONG_PARK) == {"charge_id": "ch_operator"}
    else:
        with pytest.raises(EffectFailedError) as failed:
            await ledger.run(CHARGE, handler, LONG_PARK)
        assert failed.value.code == "card_declined"
    assert store.failures["commit"] == 1
    stored = await harness.store.find(key)
    assert stored is not None and stored.status is S(outcome)


async def test_a_park_whose_reply_was_lost_still_pages_someone(harness: StoreHarness) -> None:
    store = FaultyStore(harness.store)
    paged: list[str] = []
    hooks = LedgerHooks(on_approval_required=lambda e: paged.append(e.idem_key))
    ledger = EffectLedger(EffectLedgerOptions(store=store, hooks=hooks))
    begun = await ledger.begin(CHARGE, run_options=PARK)  # the worker dies mid-handler
    await harness.age(60_000)
    store.fail("park", when="after")  # the park lands; its reply is lost
    with pytest.raises(ApprovalPendingError):
        await ledger.run(CHARGE, lambda e: 1, NO_WAIT)
    assert store.failures["park"] == 1
    stored = await harness.store.find(begun.effect.idem_key)
    assert stored is not None and stored.parked
    assert paged == [begun.effect.idem_key]
    with pytest.raises(ApprovalPendingError):  # a later caller finds it parked: no page
        await ledger.run(CHARGE, lambda e: 1, NO_WAIT)
    assert paged == [begun.effect.idem_key]


async def test_a_caller_cancelled_during_its_park_still_pages_someone(
    harness: StoreHarness,
) -> None:
    """The park is carried to its end through the caller's cancellation, and if it
    landed the caller pages before the cancellation propagates."""
    store = FaultyStore(harness.store)
    paged: list[str] = []
    hooks = LedgerHooks(on_approval_required=lambda e: paged.append(e.idem_key))
    ledger = EffectLedger(EffectLedgerOptions(store=store, hooks=hooks))
    begun = await ledger.begin(CHARGE, run_options=PARK)
    await harness.age(60_000)
    store.slow("park", seconds=0.3)
    caller = asyncio.create_task(ledger.run(CHARGE, lambda e: 1, PARK))
    while store.calls["park"] == 0:
        await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    stored = await harness.store.find(begun.effect.idem_key)
    assert stored is not None and stored.parked
    assert paged == [begun.effect.idem_key]
    assert await ledger.park_stale() == []  # the sweep would not page: it is parked already


async def test_expected_attempt_past_the_columns_range_is_bad_input(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    parked = await make_parked(ledger, CHARGE, harness.age)
    key = parked.idem_key

    async def approve(n: int) -> bool:
        return await ledger.approve(key, by="ops", expected_attempt=n)

    async def deny(n: int) -> bool:
        return await ledger.deny(key, reason="no", expected_attempt=n)

    async def resolve(n: int) -> bool:
        return await ledger.resolve(key, result=1, by="ops", expected_attempt=n)

    for settle in (approve, deny, resolve):
        for attempt in (MAX_ATTEMPT + 1, 2**63, 10**20):
            with pytest.raises(EffectLedgerValidationError, match="expected_attempt") as bad:
                await settle(attempt)
            assert bad.value.field == "expected_attempt"
    assert await harness.store.find(parked.idem_key) == parked


# -- sagas -----------------------------------------------------------------------------


class _PausedBeforeStart(FaultyStore[Any]):
    """The saga owner's store: its run is paused just before recording its handler's start."""

    def __init__(self, inner: Any, go: asyncio.Event, done: asyncio.Event) -> None:
        super().__init__(inner)
        self._go, self._done = go, done

    async def mark_started(self, effect_id: str, **kwargs: Any) -> bool:
        await self._go.wait()
        try:
            return bool(await self.inner.mark_started(effect_id, **kwargs))
        finally:
            self._done.set()


class _WakesTheOwner(FaultyStore[Any]):
    """The recoverer's store: the moment it acts on the silent holder (a claim, or a
    cancel), the paused owner wakes and records its start first."""

    def __init__(self, inner: Any, go: asyncio.Event, done: asyncio.Event) -> None:
        super().__init__(inner)
        self._go, self._done = go, done

    async def _owner_first(self) -> None:
        if not self._go.is_set():
            self._go.set()
            await self._done.wait()

    async def claim(self, idem_key: str, **kwargs: Any) -> ClaimOutcome:
        await self._owner_first()
        outcome: ClaimOutcome = await self.inner.claim(idem_key, **kwargs)
        return outcome

    async def transition(self, idem_key: str, **kwargs: Any) -> Effect | None:
        if kwargs.get("target") is S.CANCELED:
            await self._owner_first()
        moved: Effect | None = await self.inner.transition(idem_key, **kwargs)
        return moved


async def test_a_rollback_never_cancels_a_park_run_whose_handler_just_started(
    harness: StoreHarness,
) -> None:
    """A recovery pass rolls back an abandoned saga whose park step's holder looked
    dead for a lease before it recorded its handler's start. The holder was only
    paused: it wakes and records its start just as the pass acts. The pass must
    not cancel that run (its charge would stand, never undone, nobody asked)."""
    go, done = asyncio.Event(), asyncio.Event()
    owner = EffectLedger(EffectLedgerOptions(store=_PausedBeforeStart(harness.store, go, done)))
    recoverer = EffectLedger(EffectLedgerOptions(store=_WakesTheOwner(harness.store, go, done)))
    charges: list[str] = []
    refunds: list[str] = []
    for ledger in (owner, recoverer):

        @ledger.tool(
            "pay",
            on_stale="park",
            compensate="refund",
            run_options=RunOptions(stale=StaleOptions(after_ms=1_000)),
        )
        async def pay(order: str) -> dict[str, str]:
            charges.append(order)
            await asyncio.sleep(0.2)
            return {"charge": "ch_1"}

        @ledger.tool("refund")
        async def refund(forward: Effect) -> str:
            refunds.append(forward.idem_key)
            return "refunded"

    owner_pay = owner.tools["pay"]
    saga = owner.saga("order-1", lease_ms=600, abandon_after=timedelta(seconds=1))

    async def saga_code() -> None:
        async with saga:
            await owner_pay("o1")

    running = asyncio.create_task(saga_code())
    while (
        await harness.store.find(owner.idem_key(ToolCall("order-1", "pay", {"order": "o1"})))
        is None
    ):
        await asyncio.sleep(0.01)
    assert saga._heartbeat is not None
    saga._heartbeat.stop()  # the saga's owner looks gone
    await harness.age(5_000)
    report = await asyncio.wait_for(recoverer.recover_sagas(), 20)
    assert report.errors == []
    assert [o.status for o in report.finished] == [SagaStatus.COMPENSATED]
    (forward,) = (await recoverer.list_effects(tool="pay")).effects
    assert charges == ["o1"]
    # The handler ran: its charge is undone (or, had it been cut off, parked for a person).
    assert forward.status is S.SUCCEEDED and refunds == [forward.idem_key]
    stored = await saga_store(recoverer).get_saga("order-1")
    assert stored is not None and stored.status is SagaStatus.COMPENSATED
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)


async def test_a_recovery_pass_waits_politely_when_the_store_refuses_the_park() -> None:
    """The pass judges the holder dead by its own clock, the store (whose clock is
    behind) refuses the park: the pass polls again after a pause, never in a hot
    loop, and parks it once the store agrees."""
    from agent_ledger import MemoryStore
    from agent_ledger.clock import ManualClock

    clock = ManualClock()
    inner = MemoryStore(clock=clock)
    counting = FaultyStore(inner)
    owner = EffectLedger(EffectLedgerOptions(store=FaultyStore(inner)))
    recoverer = EffectLedger(EffectLedgerOptions(store=counting))
    started = asyncio.Event()
    for ledger in (owner, recoverer):

        @ledger.tool(
            "pay",
            on_stale="park",
            compensate="refund",
            run_options=RunOptions(stale=StaleOptions(after_ms=2_000)),
        )
        async def pay(order: str) -> dict[str, str]:
            started.set()
            await asyncio.Event().wait()  # the worker dies inside the handler
            return {}

        @ledger.tool("refund")
        async def refund(forward: Effect) -> str:
            return "refunded"

    saga = owner.saga("order-1", lease_ms=600, abandon_after=timedelta(seconds=1))

    async def saga_code() -> None:
        async with saga:
            await owner.tools["pay"]("o1")

    running = asyncio.create_task(saga_code())
    await started.wait()
    await owner_dies(saga, owner)
    clock.advance(ms=1_500)  # the saga is abandoned; pay's lease is not out by the store's clock
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    tick = asyncio.create_task(ticker())
    passing = asyncio.create_task(recoverer.recover_sagas())
    await asyncio.sleep(3.0)  # the pass's own clock saw a whole lease go by
    assert not passing.done()
    assert counting.calls["park"] <= 20  # a poll now and then, not a hot loop
    assert ticks >= 100  # the event loop stayed free
    clock.advance(ms=60_000)  # the store now sees the holder stale too
    report = await asyncio.wait_for(passing, 10)
    ((saga_id, why),) = report.errors
    assert saga_id == "order-1" and "SagaStepParked" in why
    tick.cancel()
    running.cancel()
    await asyncio.gather(tick, running, return_exceptions=True)


async def test_a_store_error_is_no_excuse_to_skip_the_page(harness: StoreHarness) -> None:
    """A park that fails before reaching the store parks nothing and pages nobody;
    the next poll parks it and pages once."""
    store = FaultyStore(harness.store)
    paged: list[str] = []
    hooks = LedgerHooks(on_approval_required=lambda e: paged.append(e.idem_key))
    ledger = EffectLedger(EffectLedgerOptions(store=store, hooks=hooks))
    await ledger.begin(CHARGE, run_options=PARK)
    await harness.age(60_000)
    store.fail("park", error=lambda: EffectStoreError("connection lost", operation="park"))
    with pytest.raises(ApprovalPendingError):
        await ledger.run(CHARGE, lambda e: 1, NO_WAIT)
    assert store.calls["park"] == 2 and len(paged) == 1
