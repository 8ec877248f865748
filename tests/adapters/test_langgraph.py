"""LangGraph: approvals as interrupts, decisions from Command(resume=...), threads as workflows,
injected arguments, HumanInTheLoopMiddleware and recorded model calls.

Real graphs throughout: ``langchain.agents.create_agent``, LangGraph's
``create_react_agent`` and a ``ToolNode`` of our own, with a checkpointer,
driven by a scripted chat model (tests/adapters/scripted_chat.py).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, InjectedStore, ToolNode, ToolRuntime
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command
from pydantic import ValidationError

from agent_ledger import (
    Budget,
    BudgetExceededError,
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    EffectStatus,
    SqliteStore,
    Usage,
)
from agent_ledger import ToolCall as LedgerCall
from agent_ledger.adapters.langchain import as_langchain_tool, record_model_calls
from agent_ledger.adapters.langgraph import LedgerApprovals, handle_tool_errors
from tests.adapters.scripted_chat import ScriptedChat, calls_tools


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[EffectLedger]:
    store = SqliteStore(tmp_path / "ledger.db")
    yield EffectLedger(EffectLedgerOptions(store=store))
    await store.close()


def over_100(call: LedgerCall) -> bool:
    amount = call.args["amount"]
    return isinstance(amount, int) and amount > 100


def charge_tools(ledger: EffectLedger, runs: list[str], **options: Any) -> Any:
    @ledger.tool("payments.charge", requires_approval=over_100, **options)
    async def charge(order_id: str, amount: int, *, effect: Effect) -> str:
        """Charge an order."""
        runs.append(order_id)
        return f"charged {amount} for {order_id}"

    return as_langchain_tool(charge)


def config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


async def only_effect(ledger: EffectLedger) -> Effect:
    (effect,) = (await ledger.list_effects()).effects
    return effect


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def tool_node_graph(tool: Any, **node_options: Any) -> Any:
    """A graph of our own: the model's message goes straight to one ToolNode."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([tool], **node_options))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile(checkpointer=InMemorySaver())


def asks(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    message = AIMessage(
        "", tool_calls=[{"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(calls)]
    )
    return {"messages": [HumanMessage("go", id="h1"), message]}


# -- approvals are interrupts ---------------------------------------------------------


@pytest.mark.parametrize("sync", [False, True], ids=["ainvoke", "invoke"])
async def test_a_pending_approval_pauses_the_agent_with_the_effects_receipt(
    ledger: EffectLedger, sync: bool
) -> None:
    """create_agent: a call needing approval interrupts (tool, args, key, reason), runs nothing."""
    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 500})))
    agent: Any = create_agent(model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver())
    inputs = {"messages": [HumanMessage("charge o1")]}
    if sync:
        result = await asyncio.to_thread(agent.invoke, inputs, config("t1"))
    else:
        result = await asyncio.wait_for(agent.ainvoke(inputs, config("t1")), 30)
    (pause,) = result["__interrupt__"]
    effect = await only_effect(ledger)
    assert effect.status is EffectStatus.REQUIRES_APPROVAL and runs == []
    assert pause.value["type"] == "agent_ledger.approval"
    assert pause.value["tool"] == "payments.charge"
    assert pause.value["args"] == {"order_id": "o1", "amount": 500}
    assert pause.value["key"] == effect.idem_key and pause.value["workflow_id"] == "t1"
    assert "approval" in pause.value["reason"]


@pytest.mark.parametrize("sync", [False, True], ids=["ainvoke", "invoke"])
async def test_resuming_with_approval_records_who_and_runs_the_tool_once(
    ledger: EffectLedger, sync: bool
) -> None:
    """Command(resume={"approved": True, "by": ...}): approved by that person, ran once."""
    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 500})))
    agent: Any = create_agent(model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver())
    invoke = (lambda *a: asyncio.to_thread(agent.invoke, *a)) if sync else agent.ainvoke
    await invoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    decision = {"approved": True, "by": "ada", "note": "known customer"}
    result = await invoke(Command(resume=decision), config("t1"))
    assert "__interrupt__" not in result
    effect = await only_effect(ledger)
    assert effect.status is EffectStatus.SUCCEEDED and effect.executions == 1
    assert effect.decided_by == "ada" and runs == ["o1"]
    assert [m.content for m in tool_messages(result)] == ["charged 500 for o1"]
    assert result["messages"][-1].content == "done: charged 500 for o1"


async def test_resuming_with_a_denial_tells_the_model_and_denies_the_effect(
    ledger: EffectLedger,
) -> None:
    """Command(resume={"approved": False, ...}): denied (not pending), the model reads why."""
    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 500})))
    agent: Any = create_agent(model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver())
    await agent.ainvoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    decision = {"approved": False, "by": "bo", "reason": "over the limit"}
    result = await agent.ainvoke(Command(resume=decision), config("t1"))
    effect = await only_effect(ledger)
    assert effect.status is EffectStatus.DENIED and effect.decided_by == "bo" and runs == []
    (message,) = tool_messages(result)
    assert message.status == "error"
    assert "denied" in str(message.content) and "over the limit" in str(message.content)
    assert "__interrupt__" not in result


@pytest.mark.parametrize("handle", [True, False, None], ids=["True", "False", "default"])
async def test_a_tool_node_interrupts_whatever_handle_tool_errors_says(
    ledger: EffectLedger, handle: bool | None
) -> None:
    """ToolNode(handle_tool_errors=True/False/default): a pending approval is never an error
    message to the model; the graph pauses, and resumes to run the call once."""
    runs: list[str] = []
    options = {} if handle is None else {"handle_tool_errors": handle}
    graph = tool_node_graph(charge_tools(ledger, runs), **options)
    result = await graph.ainvoke(
        asks(("payments_charge", {"order_id": "o1", "amount": 500})), config("t1")
    )
    assert tool_messages(result) == [] and len(result["__interrupt__"]) == 1
    result = await graph.ainvoke(Command(resume={"approved": True, "by": "ada"}), config("t1"))
    assert [m.content for m in tool_messages(result)] == ["charged 500 for o1"] and runs == ["o1"]


async def test_create_react_agent_interrupts_and_resumes_too(ledger: EffectLedger) -> None:
    """LangGraph's own (deprecated) create_react_agent: the same pause and the same decision."""
    from langgraph.prebuilt import create_react_agent

    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 500})))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation in favour of create_agent
        agent: Any = create_react_agent(
            model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver()
        )
    result = await agent.ainvoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    assert result["__interrupt__"][0].value["tool"] == "payments.charge"
    result = await agent.ainvoke(Command(resume={"approved": True, "by": "ada"}), config("t1"))
    assert runs == ["o1"] and (await only_effect(ledger)).decided_by == "ada"


async def test_a_malformed_decision_is_refused_and_the_interrupt_can_be_answered_again(
    ledger: EffectLedger,
) -> None:
    """A resume value that is not a Decision raises from invoke and records nothing."""
    runs: list[str] = []
    graph = tool_node_graph(charge_tools(ledger, runs))
    call = asks(("payments_charge", {"order_id": "o1", "amount": 500}))
    await graph.ainvoke(call, config("t1"))
    for bad in ({"approved": "yes"}, {"by": "ada"}, {"approved": True, "color": "red"}):
        with pytest.raises(ValidationError):
            await graph.ainvoke(Command(resume=bad), config("t1"))
        assert (await only_effect(ledger)).status is EffectStatus.REQUIRES_APPROVAL
    await graph.ainvoke(Command(resume={"approved": True, "by": "ada"}), config("t1"))
    assert runs == ["o1"]


async def test_a_decision_made_outside_the_graph_stands_when_it_resumes(
    ledger: EffectLedger,
) -> None:
    """Approved through the ledger (CLI, console) while paused: the resumed run asks nobody
    and runs once; a resume value given anyway changes nothing."""
    runs: list[str] = []
    graph = tool_node_graph(charge_tools(ledger, runs))
    result = await graph.ainvoke(
        asks(("payments_charge", {"order_id": "o1", "amount": 500})), config("t1")
    )
    await ledger.approve(result["__interrupt__"][0].value["key"], by="ops")
    result = await graph.ainvoke(Command(resume={"approved": False, "by": "x"}), config("t1"))
    effect = await only_effect(ledger)
    assert runs == ["o1"] and effect.decided_by == "ops" and "__interrupt__" not in result


async def test_wait_for_approval_true_does_not_block_a_graph(ledger: EffectLedger) -> None:
    """The default wait_for_approval=True waits outside a graph; inside one it interrupts."""
    runs: list[str] = []

    @ledger.tool("ops.deploy", requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        runs.append(service)
        return "deployed"

    graph = tool_node_graph(as_langchain_tool(deploy, wait_for_approval=True))
    result = await asyncio.wait_for(
        graph.ainvoke(asks(("ops_deploy", {"service": "api"})), config("t1")), 30
    )
    assert len(result["__interrupt__"]) == 1 and runs == []


# -- the thread is the workflow -------------------------------------------------------


async def test_the_thread_is_the_workflow_unless_one_is_given(ledger: EffectLedger) -> None:
    """No workflow around the graph: the thread id; a ledger.workflow(...) around it wins."""
    runs: list[str] = []
    graph = tool_node_graph(charge_tools(ledger, runs))
    call = asks(("payments_charge", {"order_id": "o1", "amount": 5}))
    await graph.ainvoke(call, config("thread-a"))
    await graph.ainvoke(call, config("thread-a-again"))
    async with ledger.workflow("order-1"):
        await graph.ainvoke(call, config("thread-b"))
    workflows = sorted(e.workflow_id for e in (await ledger.list_effects()).effects)
    assert workflows == ["order-1", "thread-a", "thread-a-again"] and len(runs) == 3


async def test_the_same_thread_run_again_is_answered_from_the_receipt(
    ledger: EffectLedger,
) -> None:
    """A fresh checkpointer on the same thread (a lost checkpoint): the call is not repeated."""
    runs: list[str] = []
    tool = charge_tools(ledger, runs)
    call = asks(("payments_charge", {"order_id": "o1", "amount": 5}))
    first = await tool_node_graph(tool).ainvoke(call, config("t1"))
    second = await tool_node_graph(tool).ainvoke(call, config("t1"))
    assert runs == ["o1"]
    assert tool_messages(first)[0].content == tool_messages(second)[0].content


# -- injected arguments ---------------------------------------------------------------


async def test_injected_arguments_reach_the_tool_and_stay_out_of_the_key(
    ledger: EffectLedger,
) -> None:
    """ToolRuntime, InjectedState, InjectedToolCallId and InjectedStore are passed through;
    two calls with other ids (so other injected values) are one effect with the model's args."""
    seen: list[tuple[str, str, int, str]] = []

    @ledger.tool("notes.save")
    async def save(
        text: str,
        runtime: ToolRuntime,
        messages: Annotated[list[Any], InjectedState("messages")],
        call_id: Annotated[str, InjectedToolCallId],
        store: Annotated[Any, InjectedStore()],
    ) -> str:
        """Save a note."""
        seen.append((text, call_id, len(messages), type(store).__name__))
        assert runtime.tool_call_id == call_id
        return f"saved {text}"

    tool = as_langchain_tool(save)
    assert set(tool.args) == {"text"}  # what the model is shown
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    compiled: Any = graph.compile(checkpointer=InMemorySaver(), store=InMemoryStore())
    result = await compiled.ainvoke(
        asks(("notes_save", {"text": "hi"}), ("notes_save", {"text": "hi"})), config("t1")
    )
    assert seen == [("hi", "c0", 2, "InMemoryStore")]
    assert [m.content for m in tool_messages(result)] == ["saved hi", "saved hi"]
    effect = await only_effect(ledger)
    assert effect.args == {"text": "hi"} and effect.dedup_count == 1


def test_an_injected_argument_cannot_be_an_idempotency_key(ledger: EffectLedger) -> None:
    """It is not the model's and not JSON: refused when the tool is converted."""

    @ledger.tool("notes.save", idempotency_keys=["text", "call_id"])
    async def save(text: str, call_id: Annotated[str, InjectedToolCallId]) -> str:
        return text

    with pytest.raises(EffectLedgerValidationError, match="call_id"):
        as_langchain_tool(save)


# -- HumanInTheLoopMiddleware: one decision -------------------------------------------


async def test_the_middlewares_approval_is_the_ledgers_one_question_not_two(
    ledger: EffectLedger,
) -> None:
    """HumanInTheLoopMiddleware asks; LedgerApprovals records its approval in the ledger
    (decided_by = by) and the ledger's own gate does not ask again."""
    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 500})))
    hitl = HumanInTheLoopMiddleware(interrupt_on={"payments_charge": True})
    agent: Any = create_agent(
        model,
        [charge_tools(ledger, runs)],
        middleware=[hitl, LedgerApprovals(hitl, by="reviewer")],
        checkpointer=InMemorySaver(),
    )
    result = await agent.ainvoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    (pause,) = result["__interrupt__"]
    assert "action_requests" in pause.value  # the middleware's question, not the ledger's
    assert (await ledger.list_effects()).effects == []
    result = await agent.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), config("t1"))
    assert "__interrupt__" not in result and runs == ["o1"]
    effect = await only_effect(ledger)
    assert effect.status is EffectStatus.SUCCEEDED and effect.decided_by == "reviewer"


async def test_a_call_the_middleware_rejects_never_reaches_the_ledger(
    ledger: EffectLedger,
) -> None:
    """Rejected through the middleware: the model is told, nothing is stored, nothing pends."""
    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 5})))
    hitl = HumanInTheLoopMiddleware(interrupt_on={"payments_charge": True})
    agent: Any = create_agent(
        model,
        [charge_tools(ledger, runs)],
        middleware=[hitl, LedgerApprovals(hitl)],
        checkpointer=InMemorySaver(),
    )
    await agent.ainvoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    result = await agent.ainvoke(
        Command(resume={"decisions": [{"type": "reject", "message": "no"}]}), config("t1")
    )
    assert runs == [] and (await ledger.list_effects()).effects == []
    assert any("no" in str(m.content) for m in tool_messages(result))


async def test_a_call_the_middleware_does_not_gate_asks_through_the_ledger(
    ledger: EffectLedger,
) -> None:
    """A ledger policy the middleware does not cover still pauses the graph, once."""
    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 500})))
    hitl = HumanInTheLoopMiddleware(interrupt_on={"something_else": True})
    agent: Any = create_agent(
        model,
        [charge_tools(ledger, runs)],
        middleware=[hitl, LedgerApprovals(hitl)],
        checkpointer=InMemorySaver(),
    )
    result = await agent.ainvoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    assert result["__interrupt__"][0].value["type"] == "agent_ledger.approval"
    await agent.ainvoke(Command(resume={"approved": True, "by": "ada"}), config("t1"))
    assert runs == ["o1"] and (await only_effect(ledger)).decided_by == "ada"


def test_ledger_approvals_takes_the_middleware_and_who() -> None:
    """Bad input names what was wrong."""
    with pytest.raises(EffectLedgerValidationError, match="HumanInTheLoopMiddleware"):
        LedgerApprovals("hitl")  # type: ignore[arg-type]
    hitl = HumanInTheLoopMiddleware(interrupt_on={"x": True})
    with pytest.raises(EffectLedgerValidationError, match="by"):
        LedgerApprovals(hitl, by="")


# -- ledger outcomes under handle_tool_errors -----------------------------------------


async def test_handle_tool_errors_lets_a_budget_refusal_reach_the_application(
    ledger: EffectLedger,
) -> None:
    """ToolNode(handle_tool_errors=handle_tool_errors): a tool's own error is the model's,
    a budget refusal leaves invoke as BudgetExceededError."""
    runs: list[str] = []

    @ledger.tool("flaky.op")
    async def flaky(n: int) -> str:
        """Fails."""
        raise RuntimeError("boom")

    graph = StateGraph(MessagesState)
    tools = [charge_tools(ledger, runs), as_langchain_tool(flaky)]
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=handle_tool_errors))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    compiled: Any = graph.compile(checkpointer=InMemorySaver())
    result = await compiled.ainvoke(asks(("flaky_op", {"n": 1})), config("t1"))
    assert "boom" in str(tool_messages(result)[0].content)
    async with ledger.workflow("w-budget", budget=Budget(tool_calls=1)):
        await compiled.ainvoke(
            asks(("payments_charge", {"order_id": "o1", "amount": 5})), config("t2")
        )
        with pytest.raises(BudgetExceededError):
            await compiled.ainvoke(
                asks(("payments_charge", {"order_id": "o2", "amount": 5})), config("t3")
            )
    assert runs == ["o1"]


# -- model calls ----------------------------------------------------------------------


def price(provider: str, model: str, usage: Usage) -> float:
    return (usage.input_tokens + usage.output_tokens) / 100


async def test_the_agents_model_calls_are_recorded_with_usage_and_price(
    ledger: EffectLedger,
) -> None:
    """record_model_calls: each model call of the agent is an llm effect, priced."""
    runs: list[str] = []
    scripted = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 5})))
    model = record_model_calls(ledger, scripted, provider="scripted", pricing=price)
    agent: Any = create_agent(model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver())
    result = await agent.ainvoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    assert result["messages"][-1].content == "done: charged 5 for o1"
    llm = [e for e in (await ledger.list_effects()).effects if e.tool.startswith("llm.")]
    assert len(llm) == 2 == len(scripted.calls)
    assert all(e.workflow_id == "t1" and e.usage is not None for e in llm)
    assert all(e.usage.cost_usd == 0.15 for e in llm if e.usage is not None)


async def test_a_dollar_budget_refuses_the_model_call_before_the_model_is_called(
    ledger: EffectLedger,
) -> None:
    """Budget(usd=...): the call that does not fit raises BudgetExceededError, uncalled."""
    scripted = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 5})))
    model = record_model_calls(
        ledger, scripted, pricing=price, estimate=Usage(input_tokens=10, output_tokens=5)
    )
    agent: Any = create_agent(model, [charge_tools(ledger, [])], checkpointer=InMemorySaver())
    async with ledger.workflow("t1", budget=Budget(usd=0.2)):
        with pytest.raises(BudgetExceededError):
            await agent.ainvoke({"messages": [HumanMessage("charge o1")]}, config("t1"))
    assert len(scripted.calls) == 1  # the second call (0.15 more) was refused uncalled


async def test_replay_serves_the_model_and_the_tools_without_calling_either(
    ledger: EffectLedger, tmp_path: Path
) -> None:
    """ledger.replay(thread, source=the recording): the same answers, no model, no tool."""
    runs: list[str] = []
    scripted = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 5})))
    model = record_model_calls(ledger, scripted, pricing=price)
    agent: Any = create_agent(model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver())
    question = {"messages": [HumanMessage("charge o1", id="q1")]}
    recorded = await agent.ainvoke(question, config("t1"))

    fresh = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "replay.db")))
    again: list[str] = []
    silent = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 5})))
    replaying: Any = create_agent(
        record_model_calls(fresh, silent, pricing=price),
        [charge_tools(fresh, again)],
        checkpointer=InMemorySaver(),
    )
    async with fresh.replay("t1", source=ledger.store):
        replayed = await replaying.ainvoke(question, config("t1"))
    assert replayed["messages"][-1].content == recorded["messages"][-1].content
    assert silent.calls == [] and again == [] and runs == ["o1"]
    await fresh.store.close()


async def test_two_pending_calls_in_one_reply_are_two_interrupts_answered_by_id(
    ledger: EffectLedger,
) -> None:
    """create_agent runs each tool call as its own task: two pauses, each decision goes
    to its own effect, whichever order the tasks ran in."""
    runs: list[str] = []
    model = ScriptedChat(
        reply=calls_tools(
            ("payments_charge", {"order_id": "o1", "amount": 500}),
            ("payments_charge", {"order_id": "o2", "amount": 700}),
        )
    )
    agent: Any = create_agent(model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver())
    result = await agent.ainvoke({"messages": [HumanMessage("charge both")]}, config("t1"))
    pauses = {p.value["args"]["order_id"]: p for p in result["__interrupt__"]}
    assert sorted(pauses) == ["o1", "o2"]
    answers = {
        pauses["o1"].id: {"approved": True, "by": "ada"},
        pauses["o2"].id: {"approved": False, "by": "bo", "reason": "too much"},
    }
    result = await agent.ainvoke(Command(resume=answers), config("t1"))
    effects = {e.args["order_id"]: e for e in (await ledger.list_effects()).effects}
    assert effects["o1"].status is EffectStatus.SUCCEEDED and effects["o1"].decided_by == "ada"
    assert effects["o2"].status is EffectStatus.DENIED and effects["o2"].decided_by == "bo"
    assert runs == ["o1"] and "__interrupt__" not in result


# -- turns and scopes -----------------------------------------------------------------


async def test_the_turn_is_the_human_message_that_started_it(ledger: EffectLedger) -> None:
    """Each effect records the id of the human message whose turn made the call."""
    runs: list[str] = []
    model = ScriptedChat(reply=calls_tools(("payments_charge", {"order_id": "o1", "amount": 5})))
    agent: Any = create_agent(model, [charge_tools(ledger, runs)], checkpointer=InMemorySaver())
    await agent.ainvoke({"messages": [HumanMessage("charge", id="m1")]}, config("t1"))
    await agent.ainvoke({"messages": [HumanMessage("again", id="m2")]}, config("t1"))
    turns = sorted(e.turn or "" for e in (await ledger.list_effects()).effects)
    assert turns == ["m1", "m2"] and runs == ["o1", "o1"]


async def test_a_workflow_scoped_tool_says_it_answered_from_an_earlier_turn(
    ledger: EffectLedger,
) -> None:
    """scope="workflow" on the tool wins over the adapter's "turn": a later turn gets the
    receipt, and the model reads that it was already done, when, and under which receipt."""
    runs: list[str] = []

    @ledger.tool("accounts.open", scope="workflow")
    async def open_account(owner: str) -> str:
        """Open an account."""
        runs.append(owner)
        return f"account for {owner}"

    model = ScriptedChat(reply=calls_tools(("accounts_open", {"owner": "ada"})))
    agent: Any = create_agent(
        model, [as_langchain_tool(open_account)], checkpointer=InMemorySaver()
    )
    await agent.ainvoke({"messages": [HumanMessage("open", id="m1")]}, config("t1"))
    result = await agent.ainvoke({"messages": [HumanMessage("open", id="m2")]}, config("t1"))
    (later,) = [m for m in tool_messages(result) if m.tool_call_id.startswith("m2")]
    assert str(later.content).startswith("Already done at ")
    assert "earlier turn" in str(later.content) and "account for ada" in str(later.content)
    assert runs == ["ada"]


async def test_a_call_scoped_tool_runs_once_per_tool_call_id(ledger: EffectLedger) -> None:
    """scope="call": the framework's tool-call id is the key; two ids, two runs."""
    runs: list[str] = []

    @ledger.tool("dice.roll", scope="call")
    async def roll(sides: int) -> str:
        """Roll a die."""
        runs.append(str(sides))
        return f"rolled a d{sides}"

    graph = tool_node_graph(as_langchain_tool(roll))
    call = asks(("dice_roll", {"sides": 6}), ("dice_roll", {"sides": 6}))
    await graph.ainvoke(call, config("t1"))
    await tool_node_graph(as_langchain_tool(roll)).ainvoke(call, config("t1"))  # same ids
    assert runs == ["6", "6"]


async def test_a_turn_given_around_the_graph_wins(ledger: EffectLedger) -> None:
    """ledger.workflow(id, turn=...) around invoke: its turn, not the human message's."""
    runs: list[str] = []
    graph = tool_node_graph(charge_tools(ledger, runs))
    async with ledger.workflow("order-1", turn="request-9"):
        await graph.ainvoke(asks(("payments_charge", {"order_id": "o1", "amount": 5})), config("t"))
    effect = await only_effect(ledger)
    assert effect.workflow_id == "order-1" and effect.turn == "request-9"


async def test_a_final_failure_replayed_tells_the_model_retrying_will_not_help(
    ledger: EffectLedger,
) -> None:
    """Not a ToolException: recorded final. Under handle_tool_errors, a repeat in the turn
    reads the replayed failure with its remedy, and the tool does not run again."""
    runs: list[int] = []

    @ledger.tool("flaky.op")
    async def flaky(n: int) -> str:
        """Fails."""
        runs.append(n)
        raise RuntimeError("disk full")

    graph = tool_node_graph(as_langchain_tool(flaky), handle_tool_errors=handle_tool_errors)
    result = await graph.ainvoke(asks(("flaky_op", {"n": 1}), ("flaky_op", {"n": 1})), config("t"))
    texts = sorted(str(m.content) for m in tool_messages(result))
    assert runs == [1] and "disk full" in texts[0] and "disk full" in texts[1]
    # the replay says what calling again does
    assert any("calling again with the same arguments gives this answer" in t for t in texts)
