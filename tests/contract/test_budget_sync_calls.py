"""A plain (sync) ``call_fn`` whose run outlives its caller (issue 13, second pass).

Before: ``ledger.llm`` ran a plain ``call_fn`` with ``asyncio.to_thread``
inside an async handler. A deadline (``RunOptions(timeout_ms=...)``) or a
cancelled caller cancelled the await, not the thread: the effect was
recorded ``canceled`` with no usage, its hold released, and the thread's
provider call answered (and was paid) later, booked as $0, while another
call took its room. Every store, through the harness.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agent_ledger import (
    Budget,
    BudgetExceededError,
    EffectLedger,
    EffectStatus,
    LLMResult,
    RunOptions,
    ToolCall,
    Usage,
)
from agent_ledger.budgets import Spend
from agent_ledger.errors import HandlerTimeoutError
from tests.budget_helpers import price
from tests.harness import StoreHarness

W = "agent-13s"
#: $1.00 at $1 per million tokens: the whole budget.
WHOLE = Usage(input_tokens=500_000, output_tokens=500_000)


def _key(ledger: EffectLedger, q: str) -> str:
    args = {"provider": "fake", "model": "m1", "request": {"q": q}}
    return ledger.idem_key(ToolCall(workflow_id=W, tool="llm.fake", args=args))  # type: ignore[arg-type]


class _Blocking:
    """A blocking SDK: call "A" waits (in its thread) until ``go`` is set."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.entered = threading.Event()
        self.answered: list[str] = []

    def __call__(self, request: dict[str, str]) -> LLMResult:
        if request["q"] == "A":
            self.entered.set()
            assert self.go.wait(10)
        self.answered.append(request["q"])
        return LLMResult({"a": request["q"]}, WHOLE)


async def _ask(
    ledger: EffectLedger, sdk: _Blocking, q: str, options: RunOptions | None = None
) -> object:
    return await ledger.llm(
        sdk,
        provider="fake",
        model="m1",
        request={"q": q},
        pricing=price,
        estimate=WHOLE,
        run_options=options,
    )


async def test_a_sync_call_fn_past_its_deadline_is_waited_for_and_booked(
    harness: StoreHarness,
) -> None:
    """a4: the deadline cannot stop the thread; the run waits for it (as for any
    plain handler), records what it used, and the budget books it."""
    ledger = harness.ledger()
    sdk = _Blocking()
    threading.Timer(0.4, sdk.go.set).start()
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        with pytest.raises(HandlerTimeoutError):
            await _ask(ledger, sdk, "A", RunOptions(timeout_ms=100))
        effect = await ledger.find_by_idem_key(_key(ledger, "A"))
        assert effect is not None and effect.status is EffectStatus.FAILED
        assert effect.usage is not None and effect.usage.cost_usd == 1.0
        state = await ledger.budget(W)
        assert state is not None and state.spent.usd_micros == 1_000_000
        with pytest.raises(BudgetExceededError):
            await _ask(ledger, sdk, "B")
    assert sdk.answered == ["A"]
    state = await ledger.budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0


async def _settled(ledger: EffectLedger) -> Spend:
    """The budget's spent once its holds are gone (the thread ended and was booked)."""
    deadline = time.monotonic() + 10
    while True:
        state = await ledger.budget(W)
        assert state is not None
        if state.holds == 0 or time.monotonic() > deadline:
            assert state.holds == 0 and state.reserved == Spend(), state
            return state.spent
        await asyncio.sleep(0.02)


async def test_a_cancelled_callers_sync_call_fn_keeps_its_room_until_it_answers(
    harness: StoreHarness,
) -> None:
    """a4b: the caller is cancelled while its call_fn blocks in a thread; the
    room stays held until the thread ends, and what it used is booked."""
    ledger = harness.ledger()
    sdk = _Blocking()
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        task = asyncio.create_task(_ask(ledger, sdk, "A"))
        assert await asyncio.to_thread(sdk.entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        state = await ledger.budget(W)
        assert state is not None and state.reserved.usd_micros == 1_000_000
        with pytest.raises(BudgetExceededError):
            await _ask(ledger, sdk, "B")
        sdk.go.set()
        assert (await _settled(ledger)).usd_micros == 1_000_000
        with pytest.raises(BudgetExceededError):
            await _ask(ledger, sdk, "B")
    assert sdk.answered == ["A"]
