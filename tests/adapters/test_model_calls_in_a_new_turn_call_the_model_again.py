"""Recorded model calls are keyed by the turn: the same prompt in a new turn calls the
model again; a retry of the turn (and a replay of it) gets the recorded reply.

pydantic-ai's ``Agent`` over ``LedgerModel(FunctionModel)`` and LangChain's
``create_agent`` over ``record_model_calls(ScriptedChat)``: the frameworks' own runners.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
from agent_ledger.adapters.langchain import record_model_calls
from agent_ledger.adapters.pydantic_ai import LedgerModel
from tests.adapters.scripted_chat import ScriptedChat


async def _scopes(ledger: EffectLedger) -> list[tuple[str | None, str | None]]:
    effects = (await ledger.list_effects(workflow_id="daily-report")).effects
    return sorted((e.scope, e.turn) for e in effects)


async def test_pydantic_ai_ledger_model_answers_a_new_turn_afresh() -> None:
    store = MemoryStore()
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    calls: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        return ModelResponse(parts=[TextPart(f"answer #{len(calls)}")])

    agent = Agent(LedgerModel(FunctionModel(answer), ledger))
    outputs = []
    for turn in ("mon", "mon", "tue"):  # the second "mon" is a retry of that turn
        async with ledger.workflow("daily-report", turn=turn):
            outputs.append((await agent.run("what's new today?")).output)
    assert outputs == ["answer #1", "answer #1", "answer #2"] and len(calls) == 2
    assert await _scopes(ledger) == [("turn", "mon"), ("turn", "tue")]

    # A replay of Tuesday's turn is served from its recording: no model call.
    replayer = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    silent = Agent(LedgerModel(FunctionModel(answer), replayer))
    async with (
        replayer.replay("daily-report", source=store),
        replayer.workflow("daily-report", turn="tue"),
    ):
        assert (await silent.run("what's new today?")).output == "answer #2"
    assert len(calls) == 2


async def test_langchain_recorded_chat_model_answers_a_new_turn_afresh() -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))

    def reply(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(f"answer #{len(scripted.calls)}")

    scripted = ScriptedChat(reply=reply)
    agent: Any = create_agent(record_model_calls(ledger, scripted, provider="scripted"), [])
    outputs = []
    for turn in ("mon", "mon", "tue"):
        async with ledger.workflow("daily-report", turn=turn):
            result = await agent.ainvoke({"messages": [HumanMessage("what's new today?")]})
            outputs.append(result["messages"][-1].content)
    assert outputs == ["answer #1", "answer #1", "answer #2"] and len(scripted.calls) == 2
    assert await _scopes(ledger) == [("turn", "mon"), ("turn", "tue")]
