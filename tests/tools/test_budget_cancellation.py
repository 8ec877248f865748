"""Cancellation at each await of a budgeted call: the reservation never leaks.

A MemoryStore whose budget steps pause (after doing their work, as a
statement whose reply is late would) lets the test cancel the caller at
exactly that await.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from agent_ledger import Budget, LLMResult, MemoryStore, Usage
from agent_ledger.budgets import Spend
from agent_ledger.stores.budget_base import NewHold
from agent_ledger.testing import build_ledger


class PausingStore(MemoryStore):
    """Pauses inside one budget step, after the step has landed."""

    def __init__(self, pause_in: str) -> None:
        super().__init__()
        self.pause_in = pause_in
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    async def _pause(self, step: str) -> None:
        if step == self.pause_in:
            self.paused.set()
            await self.resume.wait()

    async def reserve_budget(self, hold: NewHold) -> bool:
        done = await super().reserve_budget(hold)
        await self._pause("reserve")
        return done

    async def book_charge(
        self,
        workflow_id: str,
        *,
        idem_key: str,
        charge: Spend,
        hold_id: str | None,
        finished_at: datetime | None = None,
    ) -> bool:
        booked = await super().book_charge(
            workflow_id, idem_key=idem_key, charge=charge, hold_id=hold_id, finished_at=finished_at
        )
        await self._pause("book")
        return booked


def price(provider: str, model: str, usage: Usage) -> float:
    return 0.25


async def test_cancelled_while_reserving_releases_what_it_reserved() -> None:
    store = PausingStore("reserve")
    ledger = build_ledger(store)
    reached: list[object] = []

    async def model(request: object) -> LLMResult:
        reached.append(request)
        return LLMResult({"ok": True}, Usage(10, 10))

    async def call() -> None:
        async with ledger.workflow("w", budget=Budget(usd=1.0)):
            await ledger.llm(
                model, provider="fake", model="m", request={}, pricing=price, estimate=Usage(10)
            )

    task = asyncio.create_task(call())
    await store.paused.wait()
    held = await store.get_budget("w")
    assert held is not None and held.holds == 1, "the reservation had landed"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reached == [], "the provider was never called"
    state = await store.get_budget("w")
    assert state is not None and state.reserved == Spend() and state.holds == 0
    assert state.spent == Spend()


async def test_cancelled_while_booking_still_books_once() -> None:
    store = PausingStore("book")
    ledger = build_ledger(store)

    async def model(request: object) -> LLMResult:
        return LLMResult({"ok": True}, Usage(10, 10))

    async def call() -> None:
        async with ledger.workflow("w", budget=Budget(usd=1.0)):
            await ledger.llm(
                model, provider="fake", model="m", request={}, pricing=price, estimate=Usage(10)
            )

    task = asyncio.create_task(call())
    await store.paused.wait()
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done(), "the booking runs on, shielded"
    store.resume.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await store.get_budget("w")
    assert state is not None and state.spent.usd_micros == 250_000
    assert state.reserved == Spend() and state.holds == 0
