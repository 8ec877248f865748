"""The five-part story for LangGraph: a create_agent agent with a checkpointer on a file,
a scripted model, ledger tools on SQLite.

(1) duplicate tool calls run the side effect once; (2) a crash after the
side effect, then a fresh ledger and agent resume the thread without
repeating it; (3) approval through LangGraph's interrupt and Command(resume),
recorded with who decided, across a restart; (4) denial the same way: the
model is told and the effect is denied; (5) the same request in a later
turn runs again while a repeat within the turn is answered from the
receipt. Plus a budget refusal and a replay. A real process kill between
the steps: tests/adapters/test_langgraph_restart.py (slow).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command

from agent_ledger import (
    Budget,
    BudgetExceededError,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    SqliteStore,
)
from agent_ledger.adapters.langchain import record_model_calls
from tests.adapters.langgraph_agent import CrashAfterTools, build_agent, config, script
from tests.adapters.scripted_chat import ScriptedChat


@dataclass
class World:
    """A ledger and a checkpointer on files in ``directory``, reopened like a new process."""

    directory: Path
    ledger: EffectLedger
    saver: Any

    @property
    def log(self) -> list[str]:
        path = self.directory / "sent.log"
        return path.read_text().splitlines() if path.exists() else []

    def agent(self, **options: Any) -> Any:
        return build_agent(self.ledger, self.directory / "sent.log", self.saver, **options)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world(tmp_path) as opened:
        yield opened


class open_world:
    """``async with open_world(dir)``: a fresh ledger and checkpointer on dir's files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def __aenter__(self) -> World:
        self.store = SqliteStore(self.directory / "ledger.db")
        self.saver_cm = AsyncSqliteSaver.from_conn_string(str(self.directory / "checkpoints.db"))
        saver = await self.saver_cm.__aenter__()
        return World(self.directory, EffectLedger(EffectLedgerOptions(store=self.store)), saver)

    async def __aexit__(self, *exc: object) -> None:
        await self.saver_cm.__aexit__(None, None, None)
        await self.store.close()


def said(result: dict[str, Any]) -> str:
    return str(result["messages"][-1].content)


def ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


async def test_1_duplicate_tool_calls_run_the_side_effect_once(world: World) -> None:
    """The model asks twice in one reply: one reminder, two identical answers."""
    result = await world.agent().ainvoke(ask("remind ada ada"), config())
    assert world.log == ["reminder ada"]
    answers = [m.content for m in result["messages"] if isinstance(m, ToolMessage)]
    assert answers == ["reminder sent to ada", "reminder sent to ada"]
    (effect,) = (await world.ledger.list_effects()).effects
    assert effect.executions == 1 and effect.dedup_count == 1


class Crash(Exception):
    """The process dying, in this process."""


def crash() -> None:
    raise Crash


async def test_2_a_crash_after_the_side_effect_is_not_repeated_on_resume(
    world: World, tmp_path: Path
) -> None:
    """The tool ran, the run died before LangGraph kept its result; a new ledger and
    agent on the same files resume the thread: the tool call is answered from the receipt."""
    with pytest.raises(Crash):
        await world.agent(middleware=[CrashAfterTools(crash)]).ainvoke(
            ask("remind ada"), config(), durability="sync"
        )
    assert world.log == ["reminder ada"]
    async with open_world(tmp_path) as restarted:
        result = await restarted.agent().ainvoke(None, config())
        (effect,) = (await restarted.ledger.list_effects()).effects
    assert said(result) == "done: reminder sent to ada"
    assert world.log == ["reminder ada"] and effect.dedup_count == 1


async def test_3_approval_through_the_interrupt_survives_a_restart_and_runs_once(
    world: World, tmp_path: Path
) -> None:
    """A refund over 1000 pauses the graph; after a restart, Command(resume=approve by
    ada) records ada's approval in the ledger and the refund runs once."""
    result = await world.agent().ainvoke(ask("refund o7 5000"), config())
    (pause,) = result["__interrupt__"]
    assert pause.value["tool"] == "payments.refund" and world.log == []
    async with open_world(tmp_path) as restarted:
        decision = {"approved": True, "by": "ada", "note": "checked the order"}
        result = await restarted.agent().ainvoke(Command(resume=decision), config())
        (effect,) = (await restarted.ledger.list_effects()).effects
    assert said(result) == "done: refunded 5000 on o7" and world.log == ["refund o7"]
    assert effect.status is EffectStatus.SUCCEEDED and effect.decided_by == "ada"


async def test_4_denial_through_the_interrupt_tells_the_model_and_denies_the_effect(
    world: World,
) -> None:
    """Command(resume={"approved": False, ...}): the model reads the denial, the effect is
    denied (not pending), the refund never ran."""
    agent = world.agent()
    await agent.ainvoke(ask("refund o7 5000"), config())
    decision = {"approved": False, "by": "bo", "reason": "refunds over 1000 go to finance"}
    result = await agent.ainvoke(Command(resume=decision), config())
    (effect,) = (await world.ledger.list_effects()).effects
    assert effect.status is EffectStatus.DENIED and effect.decided_by == "bo"
    assert "denied" in said(result) and "finance" in said(result) and world.log == []


async def test_5_the_same_request_in_a_later_turn_runs_again(world: World) -> None:
    """scope="turn" (the adapter's default, the turn being the human message): "remind ada"
    asked again in a later turn sends again; within a turn, repeats are receipts."""
    agent = world.agent()
    first = await agent.ainvoke(ask("remind ada ada"), config())
    second = await agent.ainvoke(ask("remind ada"), config())
    assert world.log == ["reminder ada", "reminder ada"]
    assert said(first) == "done: reminder sent to ada | reminder sent to ada"
    assert said(second) == "done: reminder sent to ada"
    effects = (await world.ledger.list_effects()).effects
    assert len(effects) == 2 and len({e.turn for e in effects}) == 2
    assert sorted(e.dedup_count for e in effects) == [0, 1]


async def test_a_retryable_failure_runs_again_when_the_model_calls_again(world: World) -> None:
    """A ToolException is recorded as retryable: the model reads that it may call again,
    does, and the tool runs again in the same turn, once more."""
    result = await world.agent().ainvoke(ask("book blue"), config())
    failed = [m for m in result["messages"] if isinstance(m, ToolMessage) and m.status == "error"]
    assert len(failed) == 1 and "busy" in str(failed[0].content)
    assert said(result).endswith("| booked blue") and world.log == ["book blue", "book blue"]
    (effect,) = (await world.ledger.list_effects()).effects
    assert effect.status is EffectStatus.SUCCEEDED and effect.attempt == 2


async def test_a_budget_refusal_reaches_the_application(world: World) -> None:
    """Budget(tool_calls=1) on the thread: the second reminder is refused, and invoke
    raises BudgetExceededError instead of telling the model to try again."""
    async with world.ledger.workflow("t1", budget=Budget(tool_calls=1)):
        with pytest.raises(BudgetExceededError):
            await world.agent().ainvoke(ask("remind ada bo"), config())
    assert world.log == ["reminder ada"] or world.log == ["reminder bo"]


async def test_replay_serves_the_recorded_run(world: World, tmp_path: Path) -> None:
    """ledger.replay(thread, source=the store): model and tools answered from the
    recording, neither called."""
    model = ScriptedChat(reply=script)
    recorded = await world.agent(model=record_model_calls(world.ledger, model)).ainvoke(
        {"messages": [HumanMessage("remind ada", id="h1")]}, config()
    )
    (tmp_path / "replay").mkdir()
    async with open_world(tmp_path / "replay") as other:
        silent = ScriptedChat(reply=script)
        agent = other.agent(model=record_model_calls(other.ledger, silent))
        async with other.ledger.replay("t1", source=world.ledger.store):
            replayed = await agent.ainvoke(
                {"messages": [HumanMessage("remind ada", id="h1")]}, config()
            )
        assert other.log == [] and silent.calls == []
    assert said(replayed) == said(recorded) == "done: reminder sent to ada"
    assert world.log == ["reminder ada"] and len(model.calls) == 2
