"""Budgets and retryable failures: each started attempt books a tool call, and a retry
that does not fit is refused before its handler runs (it is no replay). Every store."""

from __future__ import annotations

import pytest

from agent_ledger import Budget, BudgetExceededError, EffectFailedError
from tests.harness import StoreHarness

W = "agent-27-budget"


async def test_each_started_attempt_books_one_tool_call(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    attempts: list[int] = []

    @ledger.tool("lookup", retryable=(TimeoutError,))
    async def lookup(q: str) -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise TimeoutError("slow")
        return "found"

    async with ledger.workflow(W, budget=Budget(tool_calls=5)):
        with pytest.raises(TimeoutError):
            await lookup("x")
        assert await lookup("x") == "found"
        assert await lookup("x") == "found"  # a replay books nothing more
    state = await ledger.budget(W)
    assert state is not None and state.spent.tool_calls == 2
    assert attempts == [1, 2]


async def test_a_retry_that_does_not_fit_is_refused_before_it_runs(
    harness: StoreHarness,
) -> None:
    """The budget is spent by the failed attempt: the retry gets BudgetExceededError,
    not the failure's replay, and the handler does not run; a final failure still
    replays at no cost."""
    ledger = harness.ledger()
    runs = 0

    @ledger.tool("send", retryable=(ConnectionError,))
    async def send(to: str) -> str:
        nonlocal runs
        runs += 1
        raise ConnectionError("down")

    @ledger.tool("final")
    async def final(to: str) -> str:
        raise ValueError("bad address")

    async with ledger.workflow(W, budget=Budget(tool_calls=2)):
        with pytest.raises(ConnectionError):
            await send("ada")
        with pytest.raises(ValueError, match="bad address"):
            await final("ada")
        with pytest.raises(BudgetExceededError):
            await send("ada")
        with pytest.raises(EffectFailedError):
            await final("ada")
    assert runs == 1
    state = await ledger.budget(W)
    assert state is not None and state.spent.tool_calls == 2
