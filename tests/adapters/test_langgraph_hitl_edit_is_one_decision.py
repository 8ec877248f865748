"""LangChain's ``HumanInTheLoopMiddleware`` with a ``when`` gate plus ``LedgerApprovals``:
a person who edits the call decides once; the ledger records that decision for the
edited arguments and does not ask again.

The gate asks about refunds over 1000; the ledger's own policy wants a person over 100.
The model asks for 5000, the person edits it to 500 (which the gate alone would not
have asked about, but the ledger would): one interrupt, the refund of 500 runs once,
approved by the person. Through ``create_agent`` with a checkpointer and a scripted model,
in both of the middleware's interrupt modes.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from agent_ledger import EffectLedger, EffectLedgerOptions, EffectStatus, MemoryStore, ToolCall
from agent_ledger.adapters.langchain import as_langchain_tool
from agent_ledger.adapters.langgraph import LedgerApprovals
from tests.adapters.scripted_chat import ScriptedChat, calls_tools


def _over_100(call: ToolCall) -> bool:
    """The ledger's policy: a person approves refunds over 100."""
    amount = call.args["amount"]
    return isinstance(amount, int) and amount > 100


@pytest.mark.parametrize("mode", ["batched", "per_call"])
@pytest.mark.parametrize("decision", ["edit", "approve"])
async def test_an_edited_call_is_decided_once(mode: str, decision: str) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    ran: list[tuple[str, int]] = []

    @ledger.tool("pay.refund", requires_approval=_over_100)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        ran.append((order, amount))
        return f"refunded {amount} on {order}"

    hitl = HumanInTheLoopMiddleware(
        interrupt_on={
            "refund": {
                "allowed_decisions": ["approve", "edit", "reject"],
                "when": lambda request: request.tool_call["args"]["amount"] > 1000,
            }
        },
        interrupt_mode=mode,  # type: ignore[arg-type]
    )
    model = ScriptedChat(reply=calls_tools(("refund", {"order": "o1", "amount": 5000})))
    app: Any = create_agent(
        model,
        [as_langchain_tool(refund, name="refund")],
        middleware=[hitl, LedgerApprovals(hitl, by="ada")],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "t"}}
    paused = await app.ainvoke({"messages": [HumanMessage("refund o1", id="h1")]}, config)
    (asked,) = paused["__interrupt__"]
    answer: dict[str, Any] = (
        {
            "type": "edit",
            "edited_action": {"name": "refund", "args": {"order": "o1", "amount": 500}},
        }
        if decision == "edit"
        else {"type": "approve"}
    )
    resume = {"decisions": [answer]} if mode == "batched" else {asked.id: answer}
    done = await app.ainvoke(Command(resume=resume), config)

    assert "__interrupt__" not in done  # one decision: the ledger did not ask again
    amount = 500 if decision == "edit" else 5000
    assert ran == [("o1", amount)]
    (effect,) = (await ledger.list_effects(workflow_id="t")).effects
    assert effect.args == {"order": "o1", "amount": amount}
    assert effect.status is EffectStatus.SUCCEEDED and effect.decided_by == "ada"


async def test_a_call_the_gate_let_through_is_still_the_ledgers_to_ask_about() -> None:
    """The model's own call of 500 is not gated by the middleware (``when`` says no), so
    the ledger's policy asks through its own interrupt: the middleware never decided."""
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))

    @ledger.tool("pay.refund", requires_approval=_over_100)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return f"refunded {amount} on {order}"

    hitl = HumanInTheLoopMiddleware(
        interrupt_on={"refund": {"allowed_decisions": ["approve"], "when": lambda r: False}}
    )
    model = ScriptedChat(reply=calls_tools(("refund", {"order": "o1", "amount": 500})))
    app: Any = create_agent(
        model,
        [as_langchain_tool(refund, name="refund")],
        middleware=[hitl, LedgerApprovals(hitl, by="ada")],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "t"}}
    paused = await app.ainvoke({"messages": [HumanMessage("refund o1", id="h1")]}, config)
    (asked,) = paused["__interrupt__"]
    assert asked.value["type"] == "agent_ledger.approval"
    (effect,) = (await ledger.list_effects(workflow_id="t")).effects
    assert effect.status is EffectStatus.REQUIRES_APPROVAL
