"""Which workflow a tool call belongs to: ledger.workflow() scopes, or a pinned id."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import EffectLedger, EffectLedgerValidationError, MemoryStore
from agent_ledger.testing import build_ledger
from agent_ledger.tools import Tool, WorkflowScope, current_workflow


def _ledger_and_tool() -> tuple[EffectLedger, Tool[str]]:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("echo")
    async def echo(text: str) -> str:
        return text

    return ledger, echo


async def _workflows(ledger: EffectLedger) -> list[str]:
    page = await ledger.list_effects()
    return sorted(e.workflow_id for e in page.effects)


async def test_call_outside_a_workflow_raises_naming_the_tool_and_both_fixes() -> None:
    """No scope and no pinned id: a clear error, nothing stored."""
    ledger, echo = _ledger_and_tool()
    with pytest.raises(EffectLedgerValidationError) as caught:
        await echo("hi")
    message = str(caught.value)
    assert "'echo'" in message and "ledger.workflow(" in message and "workflow_id=" in message
    assert (await ledger.stats()).total == 0


async def test_scopes_nest_and_the_innermost_wins() -> None:
    """Inside nested scopes the inner id is used; leaving it restores the outer."""
    ledger, echo = _ledger_and_tool()
    async with ledger.workflow("outer"):
        await echo("a")
        async with ledger.workflow("inner"):
            assert current_workflow() == "inner"
            await echo("b")
        await echo("c")
    assert current_workflow() is None
    assert await _workflows(ledger) == ["inner", "outer", "outer"]


async def test_sync_with_works_too() -> None:
    """`with ledger.workflow(...)` sets the scope as `async with` does."""
    ledger, echo = _ledger_and_tool()
    with ledger.workflow("plain"):
        await echo("a")
    assert await _workflows(ledger) == ["plain"]


async def test_gather_children_inherit_the_scope() -> None:
    """Tasks started inside a scope (asyncio.gather) see it; sibling scopes don't mix."""
    ledger, echo = _ledger_and_tool()

    async def agent(workflow_id: str) -> None:
        async with ledger.workflow(workflow_id):
            await asyncio.gather(echo("x"), echo("y"))

    await asyncio.gather(agent("w1"), agent("w2"))
    assert await _workflows(ledger) == ["w1", "w1", "w2", "w2"]


async def test_pinned_workflow_id_is_used_and_wins_over_a_scope() -> None:
    """workflow_id= at registration works without a scope, and a scope does not move it."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("report.daily", workflow_id="reports")
    async def report(day: str) -> str:
        return day

    await report("mon")
    async with ledger.workflow("other"):
        await report("mon")
    assert await _workflows(ledger) == ["reports"]


def test_bad_workflow_id_is_refused_when_the_scope_is_made() -> None:
    """An empty id fails at ledger.workflow(), not at the first call."""
    ledger, _ = _ledger_and_tool()
    with pytest.raises(EffectLedgerValidationError, match="workflow_id"):
        ledger.workflow("")


async def test_one_scope_object_entered_by_overlapping_tasks_and_threads() -> None:
    """A module-level scope reused by tasks (and threads) whose blocks overlap."""
    import threading

    scope = WorkflowScope("shared")
    entered = asyncio.Event()

    async def first() -> str | None:
        async with scope:
            entered.set()
            await asyncio.sleep(0.02)
            return current_workflow()

    async def second() -> str | None:
        await entered.wait()
        async with scope:
            await asyncio.sleep(0.05)
            return current_workflow()

    assert list(await asyncio.gather(first(), second())) == ["shared", "shared"]
    assert current_workflow() is None

    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def in_thread() -> None:
        try:
            with scope:
                barrier.wait()
                barrier.wait()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=in_thread) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
