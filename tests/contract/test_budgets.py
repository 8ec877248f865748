"""Spend budgets and model calls, on every store: reserve before, book once after.

The provider is a counting fake (no network): the tests count how many times
it was reached, which is what a budget must bound.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from agent_ledger import (
    Budget,
    BudgetExceededError,
    EffectLedger,
    EffectLedgerValidationError,
    LLMResult,
    ToolCall,
    Usage,
)
from agent_ledger.budgets import Spend
from agent_ledger.errors import BudgetMismatchError
from agent_ledger.sagas import SagaFailed
from agent_ledger.stores.budget_base import BudgetStore, NewHold
from agent_ledger.tools import LLMReply
from tests.harness import StoreHarness

W = "agent-7"
#: $1 per million input tokens, $2 per million output tokens (for the fake provider).
IN_PRICE, OUT_PRICE = 1.0, 2.0


def price(provider: str, model: str, usage: Usage) -> float:
    assert provider == "fake" and model == "m1"
    return (usage.input_tokens * IN_PRICE + usage.output_tokens * OUT_PRICE) / 1_000_000


#: What the fake provider charges per call: 100_000 in + 100_000 out = $0.30.
CALL = Usage(input_tokens=100_000, output_tokens=100_000)


class Provider:
    """A fake model API: counts its calls and answers with fixed usage."""

    def __init__(self, usage: Usage = CALL) -> None:
        self.calls: list[object] = []
        self.usage = usage

    async def __call__(self, request: object) -> LLMResult:
        self.calls.append(request)
        return LLMResult(response={"text": f"answer {len(self.calls)}"}, usage=self.usage)


def _store(ledger: EffectLedger) -> BudgetStore:
    store = ledger.store
    assert isinstance(store, BudgetStore)
    return store


async def ask(
    ledger: EffectLedger, provider: Provider, n: int, estimate: Usage | None = CALL
) -> LLMReply:
    return await ledger.llm(
        provider,
        provider="fake",
        model="m1",
        request={"prompt": f"question {n}"},
        pricing=price,
        estimate=estimate,
    )


async def test_a_model_call_records_its_response_and_priced_usage(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W):
        first = await ask(ledger, provider, 1)
        again = await ask(ledger, provider, 1)
    assert len(provider.calls) == 1 and provider.calls[0] == {"prompt": "question 1"}
    assert (first.response, first.usage) == (again.response, again.usage)
    assert again.effect.dedup_count == 1
    assert first.response == {"text": "answer 1"}
    assert first.usage == Usage(100_000, 100_000, cost_usd=0.3)
    effect = first.effect
    assert effect.tool == "llm.fake" and effect.usage == first.usage
    assert effect.args == {"provider": "fake", "model": "m1", "request": {"prompt": "question 1"}}
    stored = await ledger.find_by_idem_key(effect.idem_key)
    assert stored is not None and stored.usage == Usage(100_000, 100_000, 0.3)


async def test_one_dollar_at_thirty_cents_a_call_reaches_the_provider_three_times(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(usd=1.00)):
        for n in range(3):
            await ask(ledger, provider, n)
        with pytest.raises(BudgetExceededError) as refused:
            await ask(ledger, provider, 3)
    assert len(provider.calls) == 3, "the 4th call never reached the provider"
    assert refused.value.units == ("usd",) and refused.value.workflow_id == W
    # Nothing was stored for the refused call.
    page = await ledger.list_effects(workflow_id=W)
    assert len(page.effects) == 3
    state = await ledger.budget(W)
    assert state is not None
    assert state.spent == Spend(300_000 * 3, 300_000, 300_000, 0)
    assert state.reserved == Spend() and state.holds == 0
    assert state.remaining()["usd"] == pytest.approx(0.1)


async def test_replays_add_nothing_and_a_new_ledger_sees_the_same_spend(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(usd=1.00)):
        answers = [await ask(ledger, provider, n) for n in range(3)]
    before = await ledger.budget(W)
    # Re-running the workflow (another process, after a restart): the budget is
    # exhausted, yet its recorded calls replay, reaching nobody and adding nothing.
    restarted = harness.ledger()
    async with restarted.workflow(W, budget=Budget(usd=1.00)):
        replayed = [await ask(restarted, provider, n) for n in range(3)]
        with pytest.raises(BudgetExceededError):
            await ask(restarted, provider, 3)
    assert [a.response for a in replayed] == [a.response for a in answers]
    assert len(provider.calls) == 3
    after = await restarted.budget(W)
    assert before is not None and after is not None
    assert after.spent == before.spent == Spend(900_000, 300_000, 300_000, 0)
    assert after.reserved == Spend()


async def test_tool_calls_count_executions_not_replays(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    ran: list[str] = []

    @ledger.tool("mail.send")
    async def send(to: str) -> str:
        ran.append(to)
        return f"sent to {to}"

    async with ledger.workflow(W, budget=Budget(tool_calls=2)):
        assert await send("ana") == "sent to ana"
        assert await send("ana") == "sent to ana"  # a replay: not counted
        assert await send("bo") == "sent to bo"
        with pytest.raises(BudgetExceededError) as refused:
            await send("cy")
        assert await send("bo") == "sent to bo"  # replays still work at the limit
    assert ran == ["ana", "bo"]
    assert refused.value.units == ("tool_calls",)
    state = await ledger.budget(W)
    assert state is not None and state.spent.tool_calls == 2 and state.reserved == Spend()


async def test_a_different_budget_for_an_existing_id_is_refused(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        await ask(ledger, provider, 0)
    with pytest.raises(BudgetMismatchError, match="already has a budget"):
        async with ledger.workflow(W, budget=Budget(usd=5.0)):
            await ask(ledger, provider, 1)
    # A sync `with` finds out at its first call, before the provider.
    with (
        ledger.workflow(W, budget=Budget(usd=1.0, tool_calls=3)),
        pytest.raises(BudgetMismatchError),
    ):
        await ask(ledger, provider, 2)
    assert len(provider.calls) == 1
    state = await ledger.budget(W)
    assert state is not None and state.limits == Budget(usd=1.0)


async def test_an_estimate_too_low_overshoots_by_at_most_one_call(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    provider = Provider(Usage(input_tokens=200_000, output_tokens=100_000))  # $0.40 a call
    low = Usage(input_tokens=100_000)  # estimated at $0.10
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        with pytest.raises(BudgetExceededError):
            for n in range(10):
                await ask(ledger, provider, n, estimate=low)
    state = await ledger.budget(W)
    assert state is not None
    assert len(provider.calls) == 3  # 0.40, 0.80, then 0.80 + 0.10 fits: 1.20
    assert state.spent.usd <= 1.0 + 0.40
    assert state.spent.usd == pytest.approx(1.2)


async def test_an_exhausted_limit_stops_even_calls_estimated_at_nothing(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(output_tokens=150_000)):
        await ask(ledger, provider, 0, estimate=Usage())
        await ask(ledger, provider, 1, estimate=Usage())  # 100k out < 150k: room was left
        with pytest.raises(BudgetExceededError, match="output_tokens"):
            await ask(ledger, provider, 2, estimate=Usage())
    assert len(provider.calls) == 2


async def test_a_nested_workflow_spends_from_its_parents_budget(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(usd=0.5)), ledger.workflow("child"):
        await ask(ledger, provider, 0)
        with pytest.raises(BudgetExceededError):
            await ask(ledger, provider, 1)
    assert len(provider.calls) == 1
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd == pytest.approx(0.3)


async def test_a_hold_left_by_a_crashed_call_is_settled_when_its_effect_finishes(
    harness: StoreHarness,
) -> None:
    """A worker reserved for call 0 and died before booking: its hold is tied to
    the effect, so the next run of that call books it and releases the hold."""
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        await ask(ledger, provider, 9)  # opens the budget
        key = ledger.idem_key(_call(ledger, 0))
        crashed = NewHold("crashed-hold", W, key, Spend(300_000), frozenset({"usd_micros"}), 60_000)
        assert await _store(ledger).reserve_budget(crashed)
        held = await ledger.budget(W)
        assert held is not None and held.reserved.usd_micros == 300_000 and held.holds == 1
        # Time passes before the run ends: its booking releases the effect's holds
        # made strictly before it finished (a manual clock would stand still).
        await harness.age(1)
        await ask(ledger, provider, 0)
    state = await ledger.budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0
    assert state.spent.usd == pytest.approx(0.6)


async def test_a_hold_whose_effect_never_ran_expires(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(usd=0.5)):
        await ask(ledger, provider, 0)  # $0.30 spent, $0.20 left
        usd = frozenset({"usd_micros"})
        lost = NewHold("lost-hold", W, "never-ran", Spend(200_000), usd, 1_000)
        assert await _store(ledger).reserve_budget(lost)
        with pytest.raises(BudgetExceededError):
            await ask(ledger, provider, 1, estimate=Usage())  # nothing left while held
        await harness.age(1_500)
        # Still $0.30 + estimate 0 < $0.50 once the expired hold is reclaimed.
        await ask(ledger, provider, 1, estimate=Usage())
    state = await ledger.budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0
    assert len(provider.calls) == 2


async def test_a_cancelled_call_gives_its_reservation_back(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    started = asyncio.Event()

    async def slow(request: object) -> LLMResult:
        started.set()
        await asyncio.sleep(60)
        raise AssertionError("not reached")

    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        task = asyncio.create_task(
            ledger.llm(slow, provider="fake", model="m1", request={}, pricing=price, estimate=CALL)
        )
        await started.wait()
        during = await ledger.budget(W)
        assert during is not None and during.reserved.usd_micros == 300_000
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    state = await ledger.budget(W)
    assert state is not None and state.reserved == Spend() and state.holds == 0
    assert state.spent == Spend()  # canceled without usage: nothing to book


async def test_a_charge_missed_by_a_crash_after_the_outcome_is_booked_on_the_next_call(
    harness: StoreHarness,
) -> None:
    """The effect finished but its booking never happened (here: it ran with no
    budget in scope). Its next call, a replay, books it from the receipt, once."""
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W):
        await ask(ledger, provider, 0)
    for _ in range(2):
        async with ledger.workflow(W, budget=Budget(usd=1.0)):
            await ask(ledger, provider, 0)
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 300_000
    assert len(provider.calls) == 1


async def test_concurrent_calls_never_take_more_than_the_limit(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    provider = Provider()
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        outcomes = await asyncio.gather(
            *(ask(ledger, provider, n) for n in range(8)), return_exceptions=True
        )
    refused = [o for o in outcomes if isinstance(o, BudgetExceededError)]
    assert len(provider.calls) == 3 and len(refused) == 5
    state = await ledger.budget(W)
    assert state is not None and state.spent.usd_micros == 900_000
    assert state.reserved == Spend()


async def test_a_saga_budget_refuses_a_step_and_compensation_still_runs(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    ran: list[str] = []

    @ledger.tool("stock.reserve", compensate="stock.release")
    async def reserve(sku: str) -> str:
        ran.append(f"reserve {sku}")
        return sku

    @ledger.tool("stock.release")
    async def release(forward: object) -> None:
        ran.append("release")

    with pytest.raises(SagaFailed):
        async with ledger.saga("order-1", budget=Budget(tool_calls=1)):
            await reserve("A")
            await reserve("B")
    assert ran == ["reserve A", "release"]
    state = await ledger.budget("order-1")
    assert state is not None and state.spent.tool_calls == 1


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"usd": -1.0}, "usd"),
        ({"usd": math.nan}, "usd"),
        ({"usd": math.inf}, "usd"),
        ({"usd": "1"}, "usd"),
        ({"tool_calls": -1}, "tool_calls"),
        ({"input_tokens": 1.5}, "input_tokens"),
        ({"output_tokens": True}, "output_tokens"),
    ],
)
async def test_bad_limits_are_refused_before_anything_is_stored(
    harness: StoreHarness, limits: dict[str, object], field: str
) -> None:
    with pytest.raises(EffectLedgerValidationError) as bad:
        Budget(**limits)  # type: ignore[arg-type]
    assert bad.value.field == field
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError):
        ledger.workflow(W, budget={"usd": 1.0})  # type: ignore[arg-type]
    assert await ledger.budget(W) is None


async def test_bad_model_call_arguments_store_nothing(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    provider = Provider()
    cases: list[dict[str, object]] = [
        {"pricing": "cheap"},
        {"pricing": lambda p, m, u: math.nan},
        {"pricing": lambda p, m, u: -0.01},
        {"estimate": {"input_tokens": 10}},
        {"provider": ""},
        {"request": {"bad": object()}},
    ]
    async with ledger.workflow(W, budget=Budget(usd=1.0)):
        for case in cases:
            kwargs: dict[str, object] = {
                "provider": "fake",
                "model": "m1",
                "request": {"q": 1},
                "pricing": price,
            } | case
            with pytest.raises(EffectLedgerValidationError):
                await ledger.llm(provider, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(EffectLedgerValidationError, match="needs pricing"):
            await ledger.llm(provider, provider="fake", model="m1", request={})
        with pytest.raises(EffectLedgerValidationError, match="call_fn must be callable"):
            await ledger.llm(42, provider="fake", model="m1", request={})  # type: ignore[arg-type]
    assert provider.calls == []
    assert (await ledger.list_effects()).effects == []
    state = await ledger.budget(W)
    assert state is not None and state.spent == Spend() and state.reserved == Spend()
    with pytest.raises(EffectLedgerValidationError, match="outside a workflow"):
        await ledger.llm(provider, provider="fake", model="m1", request={})


def _call(ledger: EffectLedger, n: int) -> ToolCall:
    return ToolCall(
        workflow_id=W,
        tool="llm.fake",
        args={"provider": "fake", "model": "m1", "request": {"prompt": f"question {n}"}},
    )
