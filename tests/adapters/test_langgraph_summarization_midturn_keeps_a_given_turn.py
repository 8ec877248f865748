"""LangChain's ``SummarizationMiddleware`` summarising in the middle of a turn replaces the
turn's ``HumanMessage`` with a summary message that has a fresh id, so the adapter's turn
(the human message's id) changes mid-turn. The documented remedy, the turn given with
``ledger.workflow(thread_id, turn=request_id)`` around ``invoke``, keeps a call the model
re-issues after the summary answered from its receipt: sent once. Through
``create_agent`` with a checkpointer and scripted chat models.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
from agent_ledger.adapters.langchain import as_langchain_tool
from tests.adapters.scripted_chat import ScriptedChat

#: The agent's model, call by call: remind ada, two status checks (long enough for the
#: middleware to summarise the turn's start away), then remind ada again.
_SCRIPT: dict[int, tuple[str, dict[str, Any]]] = {
    1: ("remind", {"person": "ada"}),
    2: ("status", {"what": "a"}),
    3: ("status", {"what": "b"}),
    4: ("remind", {"person": "ada"}),
}


def _agent_reply() -> Any:
    asked = [0]

    def reply(messages: list[BaseMessage]) -> AIMessage:
        asked[0] += 1
        step = _SCRIPT.get(asked[0])
        if step is None:
            return AIMessage("done")
        name, args = step
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call{asked[0]}"}])

    return reply


async def test_a_given_turn_survives_a_summary_mid_turn() -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    sent: list[str] = []

    @ledger.tool("mail.remind")
    def remind(person: str) -> str:
        """Remind someone."""
        sent.append(person)
        return f"reminded {person}"

    @ledger.tool("crm.status", scope="call")
    def status(what: str) -> str:
        """Check a status."""
        return f"status {what} ok"

    summariser = ScriptedChat(reply=lambda messages: AIMessage("reminders; statuses checked"))
    summary = SummarizationMiddleware(
        model=summariser, trigger=("messages", 6), keep=("messages", 2)
    )
    app: Any = create_agent(
        ScriptedChat(reply=_agent_reply()),
        [as_langchain_tool(remind, name="remind"), as_langchain_tool(status, name="status")],
        middleware=[summary],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "t1"}}
    async with ledger.workflow("t1", turn="req-1"):
        result = await app.ainvoke(
            {"messages": [HumanMessage("remind ada, then check", id="req-1")]}, config
        )
    first = result["messages"][0]
    assert first.additional_kwargs.get("lc_source") == "summarization"  # it did summarise
    assert sent == ["ada"]
    reminders = (await ledger.list_effects(workflow_id="t1", tool="mail.remind")).effects
    assert [e.turn for e in reminders] == ["req-1"]
