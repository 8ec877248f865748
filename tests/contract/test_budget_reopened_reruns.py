"""Budgets across a reopen: a rerun keeps its own hold and both runs are booked.

Each test names what went wrong before. A late booking of a finished run
deleted every hold of the effect, a reopened rerun's in-flight hold
included, so a third call took its room and the limit was exceeded. A
cancelled caller's thread (a plain ``call_fn``) that answered after the
effect was reopened and rerun had its usage folded into the rerun's charge
(``max``), not added, and the rerun had joined its hold at no cost: two paid
provider calls were booked as one. Every store, through the harness.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_ledger import (
    Budget,
    BudgetExceededError,
    EffectLedger,
    EffectStatus,
    LLMResult,
    ToolCall,
    Usage,
)
from agent_ledger.budgets import Spend
from agent_ledger.stores.budget_base import NewHold, detached_key
from tests.budget_helpers import budget_store, price
from tests.harness import StoreHarness

W = "agent-13c"
USD = frozenset({"usd_micros", "input_tokens", "output_tokens"})
#: A run's end after every hold a test makes, on every store's clock.
LATER = datetime(2999, 1, 1, tzinfo=UTC)


def _key(ledger: EffectLedger, q: str) -> str:
    args = {"provider": "fake", "model": "m1", "request": {"q": q}}
    return ledger.idem_key(ToolCall(workflow_id=W, tool="llm.fake", args=args))  # type: ignore[arg-type]


async def _ask(ledger: EffectLedger, call_fn: Any, q: str, estimate: Usage) -> object:
    return await ledger.llm(
        call_fn, provider="fake", model="m1", request={"q": q}, pricing=price, estimate=estimate
    )


async def _settled(ledger: EffectLedger, spent_usd_micros: int) -> None:
    """Wait (up to 5 s) until the budget's spent reaches ``spent_usd_micros``."""
    for _ in range(500):
        state = await ledger.budget(W)
        if state is not None and state.spent.usd_micros >= spent_usd_micros:
            return
        await asyncio.sleep(0.01)


# -- a late booking of a finished run keeps a reopened rerun's hold -------------------


async def test_a_booking_releases_only_the_holds_made_before_its_run_finished(
    harness: StoreHarness,
) -> None:
    """The store step: ``finished_at`` (the booked run's end) releases the
    effect's holds made strictly before it; one made at that instant or after
    keeps its room; the caller's own hold is released whatever its time."""
    store = budget_store(harness.ledger())
    await store.open_budget(W, Budget(usd=1.0))
    usd = frozenset({"usd_micros"})
    assert await store.reserve_budget(NewHold("old", W, "k", Spend(300_000), usd, 60_000))
    await harness.age(1)
    await asyncio.sleep(0.002)  # PostgreSQL's clock is the server's
    assert await store.reserve_budget(NewHold("rerun", W, "k", Spend(600_000), usd, 60_000))
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 600_000
    finished = state.updated_at  # the instant "rerun" was made
    await harness.age(1)
    await asyncio.sleep(0.002)
    assert await store.reserve_budget(NewHold("mine", W, "k", Spend(100_000), usd, 60_000))
    assert await store.book_charge(
        W, idem_key="k", charge=Spend(200_000), hold_id="mine", finished_at=finished
    )
    state = await store.get_budget(W)
    # "old" and "mine" are gone; "rerun" (made at the instant the run finished) is kept.
    assert state is not None and state.holds == 1 and state.reserved.usd_micros == 600_000
    assert state.spent.usd_micros == 200_000
    assert await store.release_hold(W, "rerun")
    assert not await store.release_hold(W, "old")
    # Without finished_at only the caller's own hold goes.
    assert await store.reserve_budget(NewHold("p", W, "k", Spend(100_000), usd, 60_000))
    assert await store.reserve_budget(NewHold("q", W, "k", Spend(100_000), usd, 60_000))
    assert not await store.book_charge(W, idem_key="k", charge=Spend(200_000), hold_id="p")
    state = await store.get_budget(W)
    assert state is not None and state.holds == 1 and state.reserved.usd_micros == 100_000


async def test_a_late_booking_of_a_failed_run_keeps_the_reopened_reruns_hold(
    harness: StoreHarness,
) -> None:
    """Before: caller A's call failed; A's settle read it finished; before its
    booking landed, the call was reopened and rerun by B ($0.60 held, in
    flight). A's booking deleted every hold of the effect, B's included, and
    a third call C ($0.60) was admitted: $1.20 spent of $1.00."""
    ledger = harness.ledger()
    store = budget_store(ledger)
    est = Usage(300_000, 300_000)  # $0.60, an upper bound: real usage == estimate
    paid: list[str] = []
    failed_once = False
    release_b = asyncio.Event()

    async def model(request: dict[str, str]) -> LLMResult:
        nonlocal failed_once
        if request["q"] == "X" and not failed_once:
            failed_once = True
            raise RuntimeError("provider 500 (nothing consumed)")
        if request["q"] == "X":
            await release_b.wait()
        paid.append(request["q"])
        return LLMResult({"a": request["q"]}, est)

    real_book = store.book_charge
    in_book = asyncio.Event()
    go_book = asyncio.Event()
    first = True

    async def paused_book(*args: Any, **kwargs: Any) -> bool:
        nonlocal first
        if first:
            first = False
            in_book.set()
            await go_book.wait()
        return await real_book(*args, **kwargs)

    store.book_charge = paused_book  # type: ignore[method-assign]
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        key = _key(ledger, "X")
        a = asyncio.create_task(_ask(ledger, model, "X", est))
        await asyncio.wait_for(in_book.wait(), 5)  # A's run failed; A is about to book it
        assert await ledger.reopen(key, by="op", reason="provider fixed")
        b = asyncio.create_task(_ask(ledger, model, "X", est))
        for _ in range(500):
            await asyncio.sleep(0.01)
            found = await ledger.find_by_idem_key(key)
            if found is not None and found.status is EffectStatus.PROCESSING:
                break
        go_book.set()
        with pytest.raises(RuntimeError, match="provider 500"):
            await a
        state = await ledger.budget(W)
        assert state is not None and state.reserved.usd_micros == 600_000 and state.holds == 1
        with pytest.raises(BudgetExceededError):
            await _ask(ledger, model, "Y", est)
        release_b.set()
        await b
    assert paid == ["X"]
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 600_000
    assert state.reserved == Spend() and state.holds == 0


# -- a cancelled caller's thread is booked apart from a rerun -------------------------


async def test_a_detached_hold_takes_a_room_of_its_own(harness: StoreHarness) -> None:
    """The store step: ``detach_hold`` moves a hold out of its effect's room
    (the room shrinks to what is left, the hold counts on its own); a later
    hold of the effect does not join it; booking the effect leaves it; its
    own key books additively."""
    store = budget_store(harness.ledger())
    await store.open_budget(W, Budget(usd=1.0))
    usd = frozenset({"usd_micros"})
    assert await store.reserve_budget(NewHold("a", W, "k", Spend(400_000), usd, 60_000))
    assert await store.reserve_budget(NewHold("w", W, "k", Spend(300_000), usd, 60_000))
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 400_000 and state.holds == 1
    assert await store.detach_hold(W, "a")
    assert not await store.detach_hold(W, "a")  # once
    assert not await store.detach_hold(W, "nobody")
    state = await store.get_budget(W)
    # k's room is w's 0.3 now; a's 0.4 counts on its own.
    assert state is not None and state.reserved.usd_micros == 700_000 and state.holds == 2
    # A rerun's hold joins w (0.4 grows k's room by 0.1), never a's: 0.8 <= 1.0.
    assert await store.reserve_budget(NewHold("b", W, "k", Spend(400_000), usd, 60_000))
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 800_000
    # Booking the effect releases its holds, not the detached one.
    assert await store.book_charge(
        W, idem_key="k", charge=Spend(400_000), hold_id="b", finished_at=LATER
    )
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 400_000 and state.holds == 1
    assert state.spent.usd_micros == 400_000
    # The thread's usage is added, under the hold's own key, once.
    own = detached_key("k", "a")
    assert await store.book_charge(W, idem_key=own, charge=Spend(400_000), hold_id="a")
    assert not await store.book_charge(W, idem_key=own, charge=Spend(400_000), hold_id="a")
    state = await store.get_budget(W)
    assert state is not None and state.spent.usd_micros == 800_000
    assert state.reserved == Spend() and state.holds == 0


async def test_a_cancelled_callers_thread_is_booked_beside_a_reruns_charge(
    harness: StoreHarness,
) -> None:
    """Before: A's plain call_fn blocked in its thread and A was cancelled
    (the effect canceled, no usage). Reopened, B reran the call, joined A's
    still-live hold at no cost and paid $0.40; A's thread then answered
    ($0.40 paid) and was booked as max(B's receipt, thread) = +$0. A third
    call C ($0.40) was admitted: the provider was paid $1.20, the budget
    said $0.80 of $1.00."""
    ledger = harness.ledger()
    est = Usage(200_000, 200_000)  # $0.40, an upper bound: real usage == estimate
    paid: list[str] = []
    entered = threading.Event()
    go = threading.Event()

    def blocking(request: dict[str, str]) -> LLMResult:  # caller A: a blocking SDK
        entered.set()
        go.wait(10)
        paid.append("A-thread")
        return LLMResult({"a": "A"}, est)

    async def model(request: dict[str, str]) -> LLMResult:  # callers B and C
        paid.append(request["q"])
        return LLMResult({"a": request["q"]}, est)

    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        key = _key(ledger, "X")
        a = asyncio.create_task(_ask(ledger, blocking, "X", est))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        found = await ledger.find_by_idem_key(key)
        assert found is not None and found.status is EffectStatus.CANCELED
        assert await ledger.reopen(key, by="op", reason="caller went away; run it again")
        await _ask(ledger, model, "X", est)  # B: room of its own beside A's thread
        state = await ledger.budget(W)
        assert state is not None and state.spent.usd_micros == 400_000
        assert state.reserved.usd_micros == 400_000  # A's thread still holds its room
        go.set()
        await _settled(ledger, 800_000)
        state = await ledger.budget(W)
        assert state is not None and state.spent.usd_micros == 800_000
        assert state.reserved == Spend() and state.holds == 0
        with pytest.raises(BudgetExceededError):
            await _ask(ledger, model, "Y", est)  # C: $0.40 more would pass the limit
    assert sorted(paid) == ["A-thread", "X"]
