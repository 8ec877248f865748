"""LangGraph: a ledger tool a node of your own invokes (no ``ToolNode``, no ``ToolRuntime``)
is keyed by the turn like one a ``ToolNode`` runs, or refused when no turn can be told.

A later turn asking the same again must run again, never be silently answered by the
first turn's receipt; a retry within the turn is answered from it. A graph whose state
has no messages (so no turn) refuses the call loudly, nothing stored, unless a turn is
given or the tool declares its scope. Real ``StateGraph`` with a checkpointer and a
scripted chat model.
"""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from agent_ledger import EffectLedger, EffectLedgerOptions, EffectLedgerValidationError, MemoryStore
from agent_ledger.adapters.langchain import as_langchain_tool
from tests.adapters.scripted_chat import ScriptedChat, calls_tools


def _ledger(sent: list[str]) -> tuple[EffectLedger, Any]:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))

    @ledger.tool("mail.remind")
    def remind(person: str) -> str:
        """Remind a person."""
        sent.append(person)
        return f"reminded {person}"

    return ledger, as_langchain_tool(remind, name="remind")


def _graph(tool: Any, *, asynchronous: bool) -> Any:
    model = ScriptedChat(reply=calls_tools(("remind", {"person": "ada"})))

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def run_tools(state: MessagesState) -> dict[str, list[Any]]:
        ai = state["messages"][-1]
        assert isinstance(ai, AIMessage)
        return {"messages": [tool.invoke({"type": "tool_call", **c}) for c in ai.tool_calls]}

    async def arun_tools(state: MessagesState) -> dict[str, list[Any]]:
        ai = state["messages"][-1]
        assert isinstance(ai, AIMessage)
        return {"messages": [await tool.ainvoke({"type": "tool_call", **c}) for c in ai.tool_calls]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", arun_tools if asynchronous else run_tools)
    graph.add_edge(START, "model")
    graph.add_edge("model", "tools")
    graph.add_edge("tools", END)
    return graph.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
async def test_a_later_turn_in_a_node_of_your_own_runs_again(asynchronous: bool) -> None:
    sent: list[str] = []
    ledger, tool = _ledger(sent)
    app = _graph(tool, asynchronous=asynchronous)
    config: Any = {"configurable": {"thread_id": "t"}}
    answers = []
    for human in ("h1", "h2"):
        message = HumanMessage("remind ada", id=human)
        result = await app.ainvoke({"messages": [message]}, config)
        answers.append(result["messages"][-1])
    assert sent == ["ada", "ada"]
    assert all(isinstance(a, ToolMessage) and a.content == "reminded ada" for a in answers)
    effects = (await ledger.list_effects(workflow_id="t")).effects
    assert sorted((e.scope, e.turn) for e in effects) == [("turn", "h1"), ("turn", "h2")]

    # The second turn's tools node run again from its checkpoint (as after a crash):
    # answered from the receipt, not re-run.
    before_tools = next(s for s in app.get_state_history(config) if s.next == ("tools",))
    retried = await app.ainvoke(None, before_tools.config)
    assert retried["messages"][-1].content == "reminded ada"
    assert sent == ["ada", "ada"]


class Counter(TypedDict):
    count: int


async def test_a_graph_with_no_messages_refuses_the_call_and_says_how_to_key_it() -> None:
    sent: list[str] = []
    ledger, tool = _ledger(sent)

    def remind_node(state: Counter) -> Counter:
        tool.invoke({"person": "ada"})
        return {"count": state["count"] + 1}

    graph = StateGraph(Counter)
    graph.add_node("remind", remind_node)
    graph.add_edge(START, "remind")
    graph.add_edge("remind", END)
    app = graph.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    with pytest.raises(EffectLedgerValidationError) as refused:
        await app.ainvoke({"count": 0}, config)
    assert refused.value.field == "turn"
    assert "cannot tell which turn" in str(refused.value)
    assert "ledger.workflow(thread_id, turn=request_id)" in str(refused.value)
    assert sent == [] and (await ledger.list_effects(workflow_id="t")).effects == []

    # Given a turn, it runs, keyed by it.
    async with ledger.workflow("t", turn="req-1"):
        await app.ainvoke({"count": 0}, {"configurable": {"thread_id": "t2"}})
    assert sent == ["ada"]
    (effect,) = (await ledger.list_effects(workflow_id="t")).effects
    assert (effect.scope, effect.turn) == ("turn", "req-1")
