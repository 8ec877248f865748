"""``LedgerApprovals`` with a model that gives two calls in one message the same id (one
that numbers ids per message, or repeats one): the person's decision approves only the
call they were shown; the other call is asked about through the ledger's own interrupt.

The middleware's gate asks about refunds over 1000; the ledger wants a person over 100.
The model asks to refund o1 5000 (shown to the person) and o2 500 (the gate lets it
through, the ledger must ask), both with the id "c1". Matching a call to the model's
message by id alone took o2's call for o1's and recorded the person's approval of a
refund they never saw. Where the person edited a call whose id is shared, which call
they edited cannot be told either: the ledger asks itself rather than infer. Through
``create_agent`` with a checkpointer and a scripted model.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from agent_ledger import EffectLedger, EffectLedgerOptions, EffectStatus, MemoryStore, ToolCall
from agent_ledger.adapters.langchain import as_langchain_tool
from agent_ledger.adapters.langgraph import LedgerApprovals
from tests.adapters.scripted_chat import ScriptedChat


def _over_100(call: ToolCall) -> bool:
    amount = call.args["amount"]
    return isinstance(amount, int) and amount > 100


def _two_refunds(second_id: str) -> Any:
    def reply(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            return AIMessage(
                "",
                tool_calls=[
                    {"name": "refund", "args": {"order": "o1", "amount": 5000}, "id": "c1"},
                    {"name": "refund", "args": {"order": "o2", "amount": 500}, "id": second_id},
                ],
            )
        return AIMessage("done")

    return reply


@pytest.mark.parametrize("second_id", ["c1", "c2"], ids=["shared-id", "own-id"])
@pytest.mark.parametrize("decision", ["approve", "edit"])
async def test_only_the_call_the_person_saw_is_approved(second_id: str, decision: str) -> None:
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
        }
    )
    app: Any = create_agent(
        ScriptedChat(reply=_two_refunds(second_id)),
        [as_langchain_tool(refund, name="refund")],
        middleware=[hitl, LedgerApprovals(hitl, by="ada")],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "t"}}
    paused = await app.ainvoke({"messages": [HumanMessage("refund both", id="h1")]}, config)
    (asked,) = paused["__interrupt__"]
    shown = [a["args"] for a in asked.value["action_requests"]]
    assert shown == [{"order": "o1", "amount": 5000}]  # the person sees o1 only
    seen = {"order": "o1", "amount": 5000 if decision == "approve" else 4000}
    answer: dict[str, Any] = (
        {"type": "approve"}
        if decision == "approve"
        else {"type": "edit", "edited_action": {"name": "refund", "args": seen}}
    )
    done = await app.ainvoke(Command(resume={"decisions": [answer]}), config)

    effects = {e.args["order"]: e for e in (await ledger.list_effects(workflow_id="t")).effects}
    interrupts = [i.value["type"] for i in done.get("__interrupt__", ())]
    if decision == "edit" and second_id == "c1":
        # The middleware applies the edit to every call with that id (o2's included), so
        # which call the person edited cannot be told: the ledger does not infer their
        # approval, it asks through its own interrupt. Nothing ran, no one decided.
        assert set(effects) == {"o1"} and effects["o1"].args == seen
        assert effects["o1"].status is EffectStatus.REQUIRES_APPROVAL
        assert effects["o1"].decided_by is None and ran == []
        assert interrupts and set(interrupts) == {"agent_ledger.approval"}
        return
    # o2 was never shown: it waits for the ledger's own question, approved by no one.
    assert effects["o2"].status is EffectStatus.REQUIRES_APPROVAL
    assert effects["o2"].decided_by is None
    assert ("o2", 500) not in ran
    assert interrupts == ["agent_ledger.approval"]
    # The call the person decided on ran once, recorded as their decision.
    assert effects["o1"].args == seen and effects["o1"].decided_by == "ada"
    assert effects["o1"].status is EffectStatus.SUCCEEDED and ran == [("o1", seen["amount"])]
