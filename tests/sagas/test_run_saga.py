"""ledger.run_saga(id, plan), on every store: the LLM-planned form, nested lists as
parallel groups, tools by name, and bad plans refused before anything exists."""

from __future__ import annotations

from typing import Any

import pytest

from agent_ledger import EffectLedgerValidationError
from agent_ledger.sagas import SagaFailed, SagaNondeterminismError, SagaStatus
from agent_ledger.sagas._saga import saga_store
from tests.harness import StoreHarness
from tests.sagas.conftest import shop_of

PLAN: list[Any] = [
    {"tool": "pay", "args": {"item": "o42"}},
    [{"tool": "reserve", "args": {"item": "A"}}, {"tool": "courier", "args": {"item": "o42"}}],
    {"tool": "ship", "args": {"item": "o42"}},
]


async def test_a_plan_runs_in_order_with_its_group_and_replays(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "pay", "reserve", "courier", "ship")
    results = await ledger.run_saga("planned", PLAN)
    assert results == [
        {"done": "pay:o42"},
        [{"done": "reserve:A"}, {"done": "courier:o42"}],
        {"done": "ship:o42"},
    ]
    assert shop.log[0] == "pay" and shop.log[-1] == "ship"
    assert sorted(shop.log[1:3]) == ["courier", "reserve"]
    assert await ledger.run_saga("planned", PLAN) == results, "replayed from receipts"
    assert len(shop.log) == 4
    steps = await saga_store(ledger).saga_steps("planned")
    assert [(s.tool, s.group_index) for s in steps] == [
        ("pay", 0),
        ("reserve", 1),
        ("courier", 1),
        ("ship", 2),
    ]
    changed = [PLAN[0], {"tool": "ship", "args": {"item": "o42"}}]
    with pytest.raises(SagaNondeterminismError, match="step 1"):
        await ledger.run_saga("planned", changed)


async def test_a_failing_planned_step_rolls_the_plan_back(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "pay", "reserve", "courier", "ship")
    shop.failing.add("ship")
    with pytest.raises(SagaFailed) as failed:
        await ledger.run_saga("planned-fail", PLAN)
    assert failed.value.status is SagaStatus.COMPENSATED
    assert shop.log[-1] == "undo pay"
    assert sorted(shop.log[-3:-1]) == ["undo courier", "undo reserve"]


@pytest.mark.parametrize(
    ("plan", "problem"),
    [
        ([], "non-empty list"),
        ({"tool": "pay"}, "non-empty list"),
        ([{"tool": "nope"}], r"step 1: no tool named 'nope' is registered \(known: "),
        ([{"tool": "pay", "args": {"item": "x", "extra": 1}}], "step 1: tool 'pay'"),
        ([PLAN[0], [{"tool": "pay"}]], r"step 2\.1: tool 'pay' missing required"),
        ([PLAN[0], []], "step 2: a parallel group needs at least one step"),
        ([{"tool": "pay", "args": ["x"]}], "step 1: args must be a mapping"),
        ([{"tool": "pay", "arguments": {}}], r"step 1: expected \{'tool'"),
        ([{"tool": "orphan", "args": {}}], "step 1: tool 'orphan' is compensated by 'nobody'"),
        ([PLAN[0], {"tool": "pay", "args": {"item": {"x"}}}], r"step 2: args\['item'\]: set"),
        (
            [PLAN[0], [PLAN[0], {"tool": "pay", "args": {"item": float("nan")}}]],
            r"step 2\.2: .*item",
        ),
    ],
)
async def test_a_bad_plan_is_refused_before_anything_exists(
    harness: StoreHarness, plan: Any, problem: str
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "pay")

    @ledger.tool("orphan", compensate="nobody")
    async def orphan() -> None:
        shop.log.append("orphan")

    with pytest.raises(EffectLedgerValidationError, match=problem) as refused:
        await ledger.run_saga("bad", plan)
    assert "Nothing was run" in str(refused.value)
    assert await saga_store(ledger).get_saga("bad") is None
    assert (await ledger.stats()).total == 0 and shop.log == []


async def test_a_refused_plan_does_not_use_up_its_saga_id(harness: StoreHarness) -> None:
    """A non-JSON argument found only when its step ran used to leave the saga
    rolled back under that id, so the corrected plan could never run there."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "pay")
    bad = [PLAN[0], {"tool": "pay", "args": {"item": {"not", "json"}}}]
    with pytest.raises(EffectLedgerValidationError, match="Nothing was run"):
        await ledger.run_saga("fixable", bad)
    assert await ledger.run_saga("fixable", [PLAN[0]]) == [{"done": "pay:o42"}]
    assert shop.log == ["pay"]
