"""Budgets book what a model call really spent and hold its room once (issue 13).

Each test names what went wrong before: a paid call booked as $0, a sync
provider call blocking the heartbeats, a rerun after ``reopen`` never booked,
a hold counted twice for one effect, a stored budget not enforced, a
compensation refused. Every store, through the harness.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable

import pytest

from agent_ledger import (
    Budget,
    BudgetExceededError,
    Effect,
    EffectFailedError,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
    LLMResult,
    ToolCall,
    Usage,
)
from agent_ledger.budgets import Spend
from agent_ledger.sagas import SagaFailed
from agent_ledger.stores.budget_base import NewHold
from tests.budget_helpers import budget_store, price
from tests.harness import StoreHarness

W = "agent-9"
#: What every fake call consumes: 100k in + 100k out, $0.20 at $1 per million tokens.
CALL = Usage(input_tokens=100_000, output_tokens=100_000)
USD = frozenset({"usd_micros", "input_tokens", "output_tokens"})


def _key(ledger: EffectLedger, request: object, workflow: str = W) -> str:
    args = {"provider": "fake", "model": "m1", "request": request}
    return ledger.idem_key(ToolCall(workflow_id=workflow, tool="llm.fake", args=args))  # type: ignore[arg-type]


class _NotJSON:
    pass


def _answers(response: object) -> Callable[[object], LLMResult]:
    return lambda request: LLMResult(response, CALL)  # type: ignore[arg-type]


def _pricing_breaks_after_the_call(fail: Callable[[], float]) -> Callable[..., float]:
    """Prices the estimate (before the call) and breaks on the real usage."""
    asked: list[Usage] = []

    def pricing(provider: str, model: str, usage: Usage) -> float:
        asked.append(usage)
        return price(provider, model, usage) if len(asked) == 1 else fail()

    return pricing


def _raise() -> float:
    raise RuntimeError("price table unavailable")


@pytest.mark.parametrize(
    ("case", "booked_usd_micros"),
    [
        ("response not JSON", 200_000),
        ("response with NaN", 200_000),
        ("pricing raises", 300_000),
        ("pricing returns NaN", 300_000),
        ("pricing returns 1e13", 300_000),
        ("read raises", 300_000),
        ("call_fn returns no LLMResult", 300_000),
    ],
)
async def test_a_paid_call_whose_answer_cannot_be_recorded_is_still_booked(
    harness: StoreHarness, case: str, booked_usd_micros: int
) -> None:
    """a01/a02-A: the provider answered (and was paid), then something after it
    failed. The effect fails, but its usage is recorded and booked: the real
    tokens priced when pricing works, else the estimate's dollars ($0.30)."""
    ledger = harness.ledger()
    reached: list[object] = []
    estimate = Usage(150_000, 150_000)  # $0.30, an upper bound of the real $0.20
    call_fn: Callable[[object], object] = _answers({"text": "ok"})
    pricing: Callable[..., float] = price
    read = None
    if case == "response not JSON":
        call_fn = _answers({"obj": _NotJSON()})
    elif case == "response with NaN":
        call_fn = _answers({"logprob": math.nan})
    elif case == "pricing raises":
        pricing = _pricing_breaks_after_the_call(_raise)
    elif case == "pricing returns NaN":
        pricing = _pricing_breaks_after_the_call(lambda: math.nan)
    elif case == "pricing returns 1e13":
        pricing = _pricing_breaks_after_the_call(lambda: 1e13)
    elif case == "read raises":

        def read(value: object) -> LLMResult:
            raise KeyError("usage")

        call_fn = lambda request: {"raw": 1}  # noqa: E731
    else:
        call_fn = lambda request: {"raw": 1}  # noqa: E731

    def provider(request: object) -> object:
        reached.append(request)
        return call_fn(request)

    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        for _ in range(2):  # the second call is answered from the failed receipt
            with pytest.raises(
                (EffectLedgerValidationError, EffectFailedError, RuntimeError, KeyError)
            ) as failed:
                await ledger.llm(
                    provider,
                    provider="fake",
                    model="m1",
                    request={"q": 1},
                    pricing=pricing,
                    estimate=estimate,
                    read=read,
                )
            assert not isinstance(failed.value, BudgetExceededError)
    assert len(reached) == 1
    effect = await ledger.find_by_idem_key(_key(ledger, {"q": 1}))
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert effect.usage is not None
    assert effect.usage.cost_usd is not None
    assert round(effect.usage.cost_usd * 1_000_000) == booked_usd_micros
    state = await ledger.budget(W)
    assert state is not None
    assert state.spent.usd_micros == booked_usd_micros
    assert state.reserved == Spend() and state.holds == 0


async def test_a_sync_call_fn_runs_in_a_worker_thread(harness: StoreHarness) -> None:
    """a15: a blocking SDK call must not stop the event loop (and with it the
    heartbeats that keep the effect from being taken over and paid again)."""
    ledger = harness.ledger()
    loop_thread = threading.get_ident()
    ran_in: list[int] = []
    ticks = 0

    def blocking(request: object) -> LLMResult:
        ran_in.append(threading.get_ident())
        time.sleep(0.3)
        return LLMResult({"ok": True}, CALL)

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        async with ledger.workflow(W):
            await ledger.llm(blocking, provider="fake", model="m1", request={})
    finally:
        ticker.cancel()
    assert ran_in and ran_in[0] != loop_thread
    assert ticks >= 5, "the loop kept running while the provider answered"


async def test_a_reopened_model_call_books_what_its_rerun_consumed(harness: StoreHarness) -> None:
    """a02-B: a failed call booked $0; after reopen, its rerun's usage is booked
    (the charge grows to the larger receipt, it is not kept at its first value)."""
    ledger = harness.ledger()
    fail = True

    def provider(request: object) -> LLMResult:
        if fail:
            raise ConnectionError("provider 503")
        return LLMResult({"text": "ok"}, CALL)

    async def ask() -> object:
        return await ledger.llm(
            provider, provider="fake", model="m1", request={"q": 1}, pricing=price, estimate=CALL
        )

    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        with pytest.raises(ConnectionError):
            await ask()
        first = await ledger.budget(W)
        assert first is not None and first.spent == Spend()
        assert await ledger.reopen(_key(ledger, {"q": 1}), by="ops", reason="outage over")
        fail = False
        await ask()
        await ask()  # a replay adds nothing
    state = await ledger.budget(W)
    assert state is not None
    assert state.spent == Spend(200_000, 100_000, 100_000, 0)
    assert state.reserved == Spend() and state.holds == 0


async def test_a_rerun_after_a_paid_failure_keeps_both_runs_on_the_receipt(
    harness: StoreHarness,
) -> None:
    """A call that was paid and failed (its answer not JSON), reopened and run
    again: both runs were paid, so the receipt and the budget hold both."""
    ledger = harness.ledger()
    responses: list[object] = [{"bad": _NotJSON()}, {"text": "ok"}]

    def provider(request: object) -> LLMResult:
        return LLMResult(responses.pop(0), CALL)  # type: ignore[arg-type]

    async def ask() -> object:
        return await ledger.llm(
            provider, provider="fake", model="m1", request={"q": 2}, pricing=price, estimate=CALL
        )

    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        with pytest.raises(EffectLedgerValidationError):
            await ask()
        assert await ledger.reopen(_key(ledger, {"q": 2}), by="ops", reason="retry")
        reply = await ask()
    assert reply.usage == Usage(200_000, 200_000, cost_usd=0.4)  # type: ignore[attr-defined]
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 400_000


async def test_a_reopened_tool_counts_each_execution(harness: StoreHarness) -> None:
    """a02-C: a tool that failed, was reopened and ran again executed twice."""
    ledger = harness.ledger()
    runs = 0

    @ledger.tool("send")
    async def send(to: str) -> str:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise ConnectionError("smtp down")
        return "sent"

    async with ledger.workflow(W, budget=Budget(tool_calls=5)):
        with pytest.raises(ConnectionError):
            await send("a")
        assert await ledger.reopen(ledger.idem_key(send.tool_call("a")), by="ops", reason="up")
        assert await send("a") == "sent"
        assert await send("a") == "sent"  # a replay
    state = await ledger.budget(W)
    assert runs == 2
    assert state is not None and state.spent.tool_calls == 2


async def test_book_charge_adds_only_what_a_larger_receipt_grew_by(harness: StoreHarness) -> None:
    """The store step itself: the charge per (budget, effect) only ever grows."""
    ledger = harness.ledger()
    store = budget_store(ledger)
    await store.open_budget(W, Budget(usd=5.0))
    assert await store.book_charge(W, idem_key="k", charge=Spend(100, 5, 5, 0), hold_id=None)
    assert not await store.book_charge(W, idem_key="k", charge=Spend(100, 5, 5, 0), hold_id=None)
    assert not await store.book_charge(W, idem_key="k", charge=Spend(50, 1, 1, 0), hold_id=None)
    assert await store.book_charge(W, idem_key="k", charge=Spend(300, 2, 9, 1), hold_id=None)
    state = await store.get_budget(W)
    assert state is not None and state.spent == Spend(300, 5, 9, 1)


async def test_a_model_call_under_a_limit_needs_an_estimate(harness: StoreHarness) -> None:
    """a03: an estimate of zero let eight workers take three times the limit.
    Under a dollar or token limit an estimate is required, before anything runs."""
    ledger = harness.ledger()
    reached: list[object] = []

    def provider(request: object) -> LLMResult:
        reached.append(request)
        return LLMResult({}, CALL)

    for budget in (Budget(usd=1.0), Budget(input_tokens=10**6), Budget(output_tokens=10**6)):
        workflow = f"wf-{budget.usd}-{budget.input_tokens}"
        async with ledger.workflow(workflow, budget=budget):
            with pytest.raises(EffectLedgerValidationError, match="needs estimate") as missing:
                await ledger.llm(provider, provider="fake", model="m1", request={}, pricing=price)
            assert missing.value.field == "estimate"
    async with ledger.workflow("tools-only", budget=Budget(tool_calls=3)):
        await ledger.llm(provider, provider="fake", model="m1", request={})  # not limited
    assert len(reached) == 1
    assert [e.tool for e in (await ledger.list_effects()).effects] == ["llm.fake"]


async def test_a_compensation_and_what_it_calls_are_never_refused(harness: StoreHarness) -> None:
    """a06: the saga's budget ran out; the undo, and the tool it calls to tell
    the customer, still run."""
    ledger = harness.ledger()
    log: list[str] = []

    @ledger.tool("notify")
    async def notify(text: str) -> str:
        log.append(f"notify {text}")
        return "ok"

    @ledger.tool("pay", compensate="refund")
    async def pay(order: str) -> str:
        log.append("pay")
        return "ch_1"

    @ledger.tool("refund")
    async def refund(forward: Effect) -> str:
        log.append("refund")
        await notify(f"refunded {forward.result}")
        return "refunded"

    @ledger.tool("ship")
    async def ship(order: str) -> str:
        log.append("ship")
        return "shipped"

    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("order-1", budget=Budget(tool_calls=1)):
            await pay("o1")
            await ship("o1")
    outcome = failed.value.outcome
    assert [s.tool for s in outcome.compensated] == ["pay"]
    assert outcome.failed_compensations == ()
    assert log == ["pay", "refund", "notify refunded ch_1"]


async def test_a_restarted_caller_replaces_the_dead_callers_hold(harness: StoreHarness) -> None:
    """a05: a worker killed mid-call left a hold for the effect; the worker that
    runs the same effect again reuses that room instead of being refused."""
    ledger = harness.ledger()
    store = budget_store(ledger)
    budget = Budget(usd=0.3)
    await store.open_budget(W, budget)
    key = _key(ledger, {"q": 1})
    dead = NewHold("dead-worker-hold", W, key, Spend(300_000, 150_000, 150_000), USD, 900_000)
    assert await store.reserve_budget(dead)
    # Time passes before the run ends: its booking releases the effect's holds
    # made strictly before it finished (a manual clock would stand still).
    await harness.age(1)
    reached: list[object] = []

    def provider(request: object) -> LLMResult:
        reached.append(request)
        return LLMResult({"ok": 1}, Usage(150_000, 150_000))

    async with ledger.workflow(W, budget=budget):
        await ledger.llm(
            provider,
            provider="fake",
            model="m1",
            request={"q": 1},
            pricing=price,
            estimate=Usage(150_000, 150_000),
        )
    assert len(reached) == 1
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 300_000
    assert state.reserved == Spend() and state.holds == 0


async def test_reserving_twice_for_one_effect_holds_its_room_once(harness: StoreHarness) -> None:
    """The store step: a second hold for the same idem key joins the first (the
    effect's room is the larger estimate, counted once); another effect's hold
    still counts. (Issue 13, second pass: it no longer replaces the first,
    whose caller may be the one running the call.)"""
    ledger = harness.ledger()
    store = budget_store(ledger)
    await store.open_budget(W, Budget(usd=0.5))
    first = NewHold("h1", W, "k", Spend(300_000), USD, 60_000)
    again = NewHold("h2", W, "k", Spend(400_000), USD, 60_000)
    other = NewHold("h3", W, "other", Spend(200_000), USD, 60_000)
    assert await store.reserve_budget(first)
    assert await store.reserve_budget(again)
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 400_000 and state.holds == 1
    assert not await store.reserve_budget(other)  # 0.4 + 0.2 > 0.5
    assert await store.release_hold(W, "h1")  # joined, not replaced: the room stays
    state = await store.get_budget(W)
    assert state is not None and state.reserved.usd_micros == 400_000 and state.holds == 1
    assert await store.release_hold(W, "h2")
    state = await store.get_budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0


async def test_a_second_caller_of_the_same_call_waits_for_its_answer(
    harness: StoreHarness,
) -> None:
    """a11-A: two callers of one model call on a budget with room for exactly
    that call: one execution, and both get its answer."""
    ledger = harness.ledger()
    reached: list[object] = []

    async def provider(request: object) -> LLMResult:
        reached.append(request)
        await asyncio.sleep(0.3)
        return LLMResult({"t": "x"}, Usage(150_000, 150_000))

    async def ask() -> object:
        reply = await ledger.llm(
            provider,
            provider="fake",
            model="m1",
            request={"q": 1},
            pricing=price,
            estimate=Usage(150_000, 150_000),
        )
        return reply.response

    async with ledger.workflow(W, budget=Budget(usd=0.3)):
        first = asyncio.ensure_future(ask())
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(ask())
        answers = await asyncio.gather(first, second)
    assert list(answers) == [{"t": "x"}, {"t": "x"}]
    assert len(reached) == 1
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 300_000
    assert state.reserved == Spend() and state.holds == 0


async def test_a_stored_budget_applies_to_a_workflow_entered_without_it(
    harness: StoreHarness,
) -> None:
    """a11-B: another worker (or an adapter) enters the workflow id without
    budget=: the budget stored under that id still limits it."""
    ledger = harness.ledger()
    reached: list[object] = []

    def provider(request: object) -> LLMResult:
        reached.append(request)
        return LLMResult({}, Usage(150_000, 150_000))

    async def ask(on: EffectLedger, n: int) -> object:
        return await on.llm(
            provider,
            provider="fake",
            model="m1",
            request={"n": n},
            pricing=price,
            estimate=Usage(150_000, 150_000),
        )

    async with ledger.workflow(W, budget=Budget(usd=0.6)):
        await ask(ledger, 0)
    other = harness.ledger()  # a second worker on the same store
    async with other.workflow(W):
        await ask(other, 1)
        with pytest.raises(BudgetExceededError):
            await ask(other, 2)
    # A sync scope looks it up at its first call.
    with other.workflow(W), pytest.raises(BudgetExceededError):
        await ask(other, 3)
    assert len(reached) == 2
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 600_000
    async with ledger.workflow("no-budget-stored"):
        await ledger.llm(provider, provider="fake", model="m1", request={})  # not limited
    assert await ledger.budget("no-budget-stored") is None


async def test_reentering_the_same_workflow_reserves_once(harness: StoreHarness) -> None:
    """a07: a helper re-entering the workflow it is in, with the same budget:
    one reservation, no hold left behind."""
    ledger = harness.ledger()
    ran: list[int] = []

    @ledger.tool("t")
    async def t(n: int) -> int:
        ran.append(n)
        return n

    budget = Budget(tool_calls=1)
    async with ledger.workflow(W, budget=budget), ledger.workflow(W, budget=budget):
        assert await t(1) == 1
        with pytest.raises(BudgetExceededError):
            await t(2)
    assert ran == [1]
    state = await ledger.budget(W)
    assert state is not None and state.spent.tool_calls == 1
    assert state.reserved == Spend() and state.holds == 0


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": 2**64},
        {"output_tokens": 10**15 + 1},
        {"cost_usd": 1e13},
        {"cost_usd": 1e9 + 1},
    ],
)
def test_usage_is_bounded_at_construction(usage: dict[str, object]) -> None:
    """a14/a13: a count no counter or encoder can hold is refused where it is made."""
    with pytest.raises(EffectLedgerValidationError) as bad:
        Usage(**usage)  # type: ignore[arg-type]
    assert bad.value.field in usage


async def test_a_provider_reporting_an_impossible_token_count_fails_once(
    harness: StoreHarness,
) -> None:
    """a14: the effect ends failed (not processing), and the provider is not
    called again by the next caller."""
    ledger = harness.ledger()
    reached: list[object] = []

    def provider(request: object) -> LLMResult:
        reached.append(request)
        return LLMResult({"ok": 1}, Usage(2**64, 10))

    async with ledger.workflow(W):
        with pytest.raises(EffectLedgerValidationError, match="input_tokens"):
            await ledger.llm(provider, provider="fake", model="m1", request={})
        with pytest.raises(EffectFailedError, match="input_tokens"):  # its receipt
            await ledger.llm(provider, provider="fake", model="m1", request={})
    effect = await ledger.find_by_idem_key(_key(ledger, {}))
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert len(reached) == 1


async def test_usage_a_handler_cannot_encode_fails_the_effect_once(
    harness: StoreHarness,
) -> None:
    """Any usage that cannot be stored fails the effect (not left processing)."""
    from agent_ledger.effects import WithUsage

    ledger = harness.ledger()
    runs = 0

    async def handler(effect: Effect) -> object:
        nonlocal runs
        runs += 1
        return WithUsage({"ok": 1}, "lots")  # type: ignore[arg-type]

    call = ToolCall(workflow_id=W, tool="raw", args={})
    for _ in range(2):
        with pytest.raises((EffectLedgerValidationError, EffectFailedError), match="Usage"):
            await ledger.run(call, handler)
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert effect.error is not None and effect.error.code == "usage_not_serializable"
    assert runs == 1


async def test_huge_estimates_are_refused_alike_on_every_store(harness: StoreHarness) -> None:
    """a13: an estimate past what a counter may hold is a validation error on
    every store, before anything is reserved."""
    ledger = harness.ledger()
    async with ledger.workflow(W, budget=Budget(usd=5.0)):
        with pytest.raises(EffectLedgerValidationError):
            await ledger.llm(
                _answers({}),
                provider="fake",
                model="m1",
                request={},
                pricing=lambda p, m, u: 0.01,
                estimate=Usage(2**63 - 1, 0),
            )
    state = await ledger.budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0
