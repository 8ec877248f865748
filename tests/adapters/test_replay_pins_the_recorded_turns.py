"""Replay of a run whose turns the framework named anew (pydantic-ai's run id, a LangGraph
human message without an id) is answered from the recording without the caller naming
the turns: each new turn is pinned to the recorded turns in the order they first appear.
A replay with more turns than the recording fails saying that the turn differs.

pydantic-ai's ``Agent`` over ``FunctionModel`` and LangChain's ``create_agent`` over a
scripted chat model, with a checkpointer: the frameworks' own runners.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
from agent_ledger.adapters.langchain import as_langchain_tool
from agent_ledger.adapters.pydantic_ai import LedgerModel, as_pydantic_ai_tool
from agent_ledger.errors import UnrecordedEffectError
from tests.adapters.scripted_chat import ScriptedChat, calls_tools


def _mailer(store: MemoryStore, sent: list[str]) -> tuple[EffectLedger, Any]:
    ledger = EffectLedger(EffectLedgerOptions(store=store))

    @ledger.tool("mail.send")
    async def send(person: str) -> str:
        """Send a reminder."""
        sent.append(person)
        return f"sent {person} #{len(sent)}"

    return ledger, send


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(str(returned[0].content))])
    return ModelResponse(parts=[ToolCallPart("mail_send", {"person": "ada"}, tool_call_id="c1")])


async def _two_turns(ledger: EffectLedger, send: Any, *, model_calls: bool) -> list[str]:
    model: Any = FunctionModel(_script)
    agent = Agent(
        LedgerModel(model, ledger) if model_calls else model, tools=[as_pydantic_ai_tool(send)]
    )
    outputs = []
    for _ in range(2):  # two requests, two runs: each its own turn (its run id)
        result = await agent.run("remind ada")
        outputs.append(str(result.output))
    return outputs


@pytest.mark.parametrize("model_calls", [False, True], ids=["tools", "tools-and-model"])
async def test_a_pydantic_ai_replay_needs_no_run_ids(model_calls: bool) -> None:
    store, sent = MemoryStore(), list[str]()
    ledger, send = _mailer(store, sent)
    async with ledger.workflow("w"):
        recorded = await _two_turns(ledger, send, model_calls=model_calls)
    assert recorded == ["sent ada #1", "sent ada #2"] and len(sent) == 2

    replayer, send_again = _mailer(MemoryStore(), sent)
    async with replayer.replay("w", source=store):
        replayed = await _two_turns(replayer, send_again, model_calls=model_calls)
    assert replayed == recorded and len(sent) == 2  # served, in order, nothing sent

    # A third turn has no recording: the error says the turn differs, and what to pass.
    replayer, send_again = _mailer(MemoryStore(), sent)
    async with replayer.replay("w", source=store):
        await _two_turns(replayer, send_again, model_calls=False)
        with pytest.raises(UnrecordedEffectError) as unrecorded:
            await _two_turns(replayer, send_again, model_calls=False)
    text = str(unrecorded.value)
    assert "has no recording in its turn" in text and "keys a call by its turn" in text
    assert "run_id=" in text and "ledger.workflow(id, turn=...)" in text
    assert len(sent) == 2


async def test_a_langgraph_replay_of_human_messages_without_ids() -> None:
    store, sent = MemoryStore(), list[str]()
    ledger, send = _mailer(store, sent)

    def agent(tool_ledger: EffectLedger, tool: Any) -> Any:
        model = ScriptedChat(reply=calls_tools(("send", {"person": "ada"})))
        return create_agent(
            model, [as_langchain_tool(tool, name="send")], checkpointer=InMemorySaver()
        )

    config: Any = {"configurable": {"thread_id": "t"}}
    app = agent(ledger, send)
    recorded = []
    for _ in range(2):  # no message ids: LangGraph makes them up, anew on every run
        result = await app.ainvoke({"messages": [HumanMessage("remind ada")]}, config)
        recorded.append(result["messages"][-1].content)
    assert len(sent) == 2

    replayer, send_again = _mailer(MemoryStore(), sent)
    app = agent(replayer, send_again)
    replayed = []
    async with replayer.replay("t", source=store):
        for _ in range(2):
            result = await app.ainvoke({"messages": [HumanMessage("remind ada")]}, config)
            replayed.append(result["messages"][-1].content)
    assert replayed == recorded and len(sent) == 2
