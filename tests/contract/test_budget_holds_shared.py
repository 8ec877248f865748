"""Budgets: the second adversarial pass over issue 13 (holds, ttl, pricing, counting).

Each test names what went wrong before: a second caller of an in-flight call
that gave up released (or shrank) the running call's hold, so a third call
took its room and the limit was exceeded; a huge ``hold_ttl_ms`` left a
permanent reservation on MemoryStore (and was accepted or failed differently
on the other stores); a pricing callback that raised gave a raw exception.
Every store, through the harness.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_ledger import (
    Budget,
    BudgetExceededError,
    EffectLedger,
    EffectLedgerValidationError,
    LLMResult,
    RetryPolicy,
    RunOptions,
    ToolCall,
    Usage,
)
from agent_ledger.budgets import Spend
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.stores import budget_base
from agent_ledger.stores.budget_base import NewHold
from tests.budget_helpers import budget_store, price
from tests.harness import StoreHarness

W = "agent-13b"
#: A run's end after every hold a test makes, on every store's clock.
LATER = datetime(2999, 1, 1, tzinfo=UTC)
#: $1.00 at $1 per million tokens: the whole budget of the tests below.
WHOLE = Usage(input_tokens=500_000, output_tokens=500_000)
USD = frozenset({"usd_micros", "input_tokens", "output_tokens"})
#: The documented bound on hold_ttl_ms (docs/budgets.md): 7 days.
MAX_HOLD_TTL_MS = 7 * 24 * 60 * 60 * 1000


def _key(ledger: EffectLedger, request: object) -> str:
    args = {"provider": "fake", "model": "m1", "request": request}
    return ledger.idem_key(ToolCall(workflow_id=W, tool="llm.fake", args=args))  # type: ignore[arg-type]


class _Slow:
    """A provider whose call "A" waits for ``release``; every call is paid ``WHOLE``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.paid: list[str] = []

    async def __call__(self, request: dict[str, str]) -> LLMResult:
        self.paid.append(request["q"])
        if request["q"] == "A":
            await self.release.wait()
        return LLMResult({"a": request["q"]}, WHOLE)


async def _ask(
    ledger: EffectLedger,
    provider: _Slow,
    q: str,
    estimate: Usage = WHOLE,
    options: RunOptions | None = None,
) -> object:
    return await ledger.llm(
        provider,
        provider="fake",
        model="m1",
        request={"q": q},
        pricing=price,
        estimate=estimate,
        run_options=options,
    )


async def _in_flight(provider: _Slow) -> None:
    while "A" not in provider.paid:
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("estimate", [WHOLE, Usage(5_000, 5_000)], ids=["same", "smaller"])
async def test_a_waiter_that_gives_up_leaves_the_running_calls_hold(
    harness: StoreHarness, estimate: Usage
) -> None:
    """a1 / a1b: a second caller of call A (same or smaller estimate) times out
    waiting; A's $1 must stay held, so call B is refused and the $1 limit holds."""
    ledger = harness.ledger()
    provider = _Slow()
    impatient = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=200))
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        first = asyncio.create_task(_ask(ledger, provider, "A"))
        await _in_flight(provider)
        with pytest.raises(EffectTimeoutError):
            await _ask(ledger, provider, "A", estimate, impatient)
        state = await ledger.budget(W)
        assert state is not None and state.reserved.usd_micros == 1_000_000
        assert state.holds == 1  # one effect holds room
        with pytest.raises(BudgetExceededError):
            await _ask(ledger, provider, "B")
        provider.release.set()
        await first
    state = await ledger.budget(W)
    assert state is not None
    assert provider.paid == ["A"]
    assert state.spent.usd_micros == 1_000_000
    assert state.reserved == Spend() and state.holds == 0


async def test_a_cancelled_waiter_leaves_the_running_calls_hold(harness: StoreHarness) -> None:
    """a1 with the second caller cancelled instead of timing out."""
    ledger = harness.ledger()
    provider = _Slow()
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        first = asyncio.create_task(_ask(ledger, provider, "A"))
        await _in_flight(provider)
        waiter = asyncio.create_task(_ask(ledger, provider, "A", Usage(1, 1)))
        await asyncio.sleep(0.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        state = await ledger.budget(W)
        assert state is not None and state.reserved.usd_micros == 1_000_000
        with pytest.raises(BudgetExceededError):
            await _ask(ledger, provider, "B")
        provider.release.set()
        await first
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 1_000_000
    assert state.reserved == Spend() and state.holds == 0


async def test_holds_of_one_effect_share_the_largest_room(harness: StoreHarness) -> None:
    """The store step: a joining hold never lowers the effect's room, a larger
    one raises it (if it fits), and leaving takes back only what the holds
    left do not need."""
    store = budget_store(harness.ledger())
    await store.open_budget(W, Budget(usd=1.0))
    usd = frozenset({"usd_micros"})
    assert await store.reserve_budget(NewHold("a", W, "k", Spend(600_000), usd, 60_000))
    assert await store.reserve_budget(NewHold("b", W, "k", Spend(100_000), usd, 60_000))
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 600_000 and state.holds == 1
    # A larger estimate grows the room by the difference, and only if that fits.
    assert not await store.reserve_budget(NewHold("c", W, "k", Spend(1_100_000), usd, 60_000))
    assert await store.reserve_budget(NewHold("c", W, "k", Spend(900_000), usd, 60_000))
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 900_000
    # Another effect sees only what is left.
    assert not await store.reserve_budget(NewHold("x", W, "other", Spend(200_000), usd, 60_000))
    assert await store.release_hold(W, "c")  # back to the largest left: a's 0.6
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 600_000
    assert await store.release_hold(W, "a")
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 100_000 and state.holds == 1
    # Booking a run that finished after every hold of the effect was made releases them all.
    assert await store.book_charge(
        W, idem_key="k", charge=Spend(50_000), hold_id=None, finished_at=LATER
    )
    state = await store.get_budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0
    assert state.spent.usd_micros == 50_000


async def test_a_waiter_of_a_call_on_a_full_budget_joins_it(harness: StoreHarness) -> None:
    """A second caller of an admitted call is never refused for room the call
    already holds, even when other calls filled the rest of the budget."""
    store = budget_store(harness.ledger())
    await store.open_budget(W, Budget(usd=1.0))
    usd = frozenset({"usd_micros"})
    assert await store.reserve_budget(NewHold("a", W, "k", Spend(0), usd, 60_000))
    assert await store.reserve_budget(NewHold("o", W, "other", Spend(1_000_000), usd, 60_000))
    assert await store.reserve_budget(NewHold("b", W, "k", Spend(0), usd, 60_000))
    # A new effect estimated at nothing still stops at the exhausted limit.
    assert not await store.reserve_budget(NewHold("n", W, "new", Spend(0), usd, 60_000))


async def test_a_takeover_ends_with_one_live_hold(harness: StoreHarness) -> None:
    """A dead worker's hold of the effect: the worker taking the call over joins
    it while it is live (one room), and drops it once it has expired."""
    store = budget_store(harness.ledger())
    await store.open_budget(W, Budget(usd=1.0))
    usd = frozenset({"usd_micros"})
    assert await store.reserve_budget(NewHold("dead", W, "k", Spend(500_000), usd, 1_000))
    assert await store.reserve_budget(NewHold("live", W, "k", Spend(500_000), usd, 60_000))
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 500_000 and state.holds == 1
    await harness.age(2_000)  # the dead worker's hold expires
    assert await store.reserve_budget(NewHold("again", W, "k", Spend(300_000), usd, 60_000))
    assert await store.reclaim_holds(W) == 0  # it was dropped by the reservation
    assert await store.release_hold(W, "live")
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 300_000 and state.holds == 1
    assert not await store.release_hold(W, "dead")
    assert await store.release_hold(W, "again")
    state = await store.get_budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0


# -- hold_ttl_ms: one bound on every store --------------------------------------


@pytest.mark.parametrize("ttl", [0, -1, MAX_HOLD_TTL_MS + 1, 10**18, 1.5, True])
async def test_a_hold_ttl_out_of_range_is_refused_and_stores_nothing(
    harness: StoreHarness, ttl: object
) -> None:
    """a13: hold_ttl_ms=10**18 left MemoryStore's ``reserved`` raised for ever
    (OverflowError after the add); SQLite took it; PostgreSQL failed with a
    store error. Now every store refuses it the same way, before anything."""
    ledger = harness.ledger()
    store = budget_store(ledger)
    await store.open_budget(W, Budget(usd=1.0))
    hold = NewHold("h", W, "k", Spend(500_000), USD, ttl)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError) as raised:
        await store.reserve_budget(hold)
    assert raised.value.field == "hold_ttl_ms"
    called: list[object] = []
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        with pytest.raises(EffectLedgerValidationError) as raised:
            await ledger.llm(
                lambda request: called.append(request),
                provider="fake",
                model="m1",
                request={"q": 1},
                pricing=price,
                estimate=WHOLE,
                hold_ttl_ms=ttl,  # type: ignore[arg-type]
            )
    assert raised.value.field == "hold_ttl_ms"
    assert called == []
    state = await store.get_budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0
    assert await ledger.find_by_idem_key(_key(ledger, {"q": 1})) is None


async def test_the_longest_hold_ttl_is_taken(harness: StoreHarness) -> None:
    assert getattr(budget_base, "MAX_HOLD_TTL_MS", None) == MAX_HOLD_TTL_MS
    store = budget_store(harness.ledger())
    await store.open_budget(W, Budget(usd=1.0))
    assert await store.reserve_budget(NewHold("h", W, "k", Spend(500_000), USD, MAX_HOLD_TTL_MS))
    await harness.age(MAX_HOLD_TTL_MS - 1_000)
    assert await store.reclaim_holds(W) == 0
    await harness.age(2_000)
    assert await store.reclaim_holds(W) == 1
    state = await store.get_budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0


# -- a pricing callback that breaks ----------------------------------------------


def _divides_by_zero(provider: str, model: str, usage: Usage) -> float:
    return 1 / 0


def _two_arguments(provider: str, model: str) -> float:
    return 0.0


@pytest.mark.parametrize(
    ("pricing", "cause"),
    [(_divides_by_zero, ZeroDivisionError), (_two_arguments, TypeError)],
    ids=["raises", "wrong-arity"],
)
async def test_a_pricing_callback_that_raises_is_a_validation_error(
    harness: StoreHarness, pricing: object, cause: type[BaseException]
) -> None:
    """a5: a pricing callback that raised (or had the wrong arity) gave the raw
    ZeroDivisionError / TypeError; the docs promise EffectLedgerValidationError
    naming the callback, nothing stored."""
    ledger = harness.ledger()
    called: list[object] = []
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        with pytest.raises(EffectLedgerValidationError) as raised:
            await ledger.llm(
                lambda request: called.append(request),
                provider="fake",
                model="m1",
                request={"q": 1},
                pricing=pricing,  # type: ignore[arg-type]
                estimate=WHOLE,
            )
    assert raised.value.field == "pricing"
    assert isinstance(raised.value.__cause__, cause)
    assert called == []
    state = await ledger.budget(W)
    assert state is not None and state.reserved == Spend() and state.spent == Spend()
    assert state.holds == 0
    assert await ledger.find_by_idem_key(_key(ledger, {"q": 1})) is None


# -- what tool_calls counts ----------------------------------------------------


async def test_tool_calls_count_one_per_run_not_per_try(harness: StoreHarness) -> None:
    """a12 (e): the docs said one tool_calls "per time its handler was started";
    the code counts one per run of the call that reached its handler: a retry
    policy's tries are one run, a re-run after reopen counts again. Pinned, and
    the docs now say so."""
    ledger = harness.ledger()
    tries = 0

    @ledger.tool("flaky.send", retry=RetryPolicy(on=(ConnectionError,), attempts=3, initial_ms=1))
    async def send(to: str) -> str:
        nonlocal tries
        tries += 1
        if tries <= 3:
            raise ConnectionError("smtp down")
        return "sent"

    async with ledger.workflow(W, budget=Budget(tool_calls=5)):
        with pytest.raises(ConnectionError):
            await send("a")  # three tries, all failed: one run
        state = await ledger.budget(W)
        assert state is not None and state.spent.tool_calls == 1
        assert await ledger.reopen(ledger.idem_key(send.tool_call("a")), by="ops", reason="again")
        assert await send("a") == "sent"  # a second run
        assert await send("a") == "sent"  # a replay: nothing
    assert tries == 4
    state = await ledger.budget(W)
    assert state is not None and state.spent.tool_calls == 2
    docs = (Path(__file__).parents[2] / "docs" / "budgets.md").read_text()
    assert "per time its handler was" not in docs
    assert "one `tool_calls` per run of the call that reached\nits handler" in docs
