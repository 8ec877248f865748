"""The LangGraph agent of the story tests: create_agent over a scripted model, ledger tools.

Shared by tests/adapters/test_langgraph_story.py (in this process) and
``python -m tests.adapters.langgraph_agent`` (the restart tests' other
processes), so both run the very same agent. Every side effect appends a
line to ``sent.log`` beside the ledger, so a test counts executions across
processes.

``python -m tests.adapters.langgraph_agent DIR PHASE`` runs one phase on the
ledger (``DIR/ledger.db``) and checkpoints (``DIR/checkpoints.db``) in DIR,
thread ``t1``, and prints one JSON line: ``ask`` (a turn asking for a large
refund, which pauses for approval), ``approve`` (resume with ``{"approved":
true, "by": "ada"}``), ``crash`` (a turn whose tool call runs, then the
process dies before LangGraph records the result: ``os._exit``) and
``recover`` (resume the crashed thread from its last checkpoint).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import ToolException
from langgraph.types import Command

from agent_ledger import EffectLedger
from agent_ledger import ToolCall as LedgerCall
from agent_ledger.adapters.langchain import as_langchain_tool
from tests.adapters.scripted_chat import ScriptedChat, results_since_human

THREAD = "t1"


def script(messages: list[BaseMessage]) -> AIMessage:
    """The model: each human message is ``TOOL ARG...`` naming the calls to make
    (``remind ada ada`` asks twice in one reply); after the results, it reports them."""
    last = messages[-1]
    if isinstance(last, ToolMessage) and "may be retried" in str(last.content):
        # The tool said calling again may work: retry once, the same call, a new id.
        asked = next(m for m in reversed(messages) if isinstance(m, AIMessage) and m.tool_calls)
        again = [
            {**c, "id": f"{c['id']}-retry"}
            for c in asked.tool_calls
            if c["id"] == last.tool_call_id
        ]
        return AIMessage("", tool_calls=again)
    if not isinstance(last, HumanMessage):
        return AIMessage("done: " + " | ".join(results_since_human(messages)))
    name, *args = str(last.content).split()
    turn = last.id or "t"
    calls: list[tuple[str, dict[str, object]]]
    if name == "remind":
        calls = [("send_reminder", {"person": a}) for a in args]
    elif name == "book":
        calls = [("book_room", {"room": args[0]})]
    else:
        calls = [("refund", {"order_id": args[0], "amount": int(args[1])})]
    return AIMessage(
        "",
        tool_calls=[{"name": n, "args": a, "id": f"{turn}-{i}"} for i, (n, a) in enumerate(calls)],
    )


def over_1000(call: LedgerCall) -> bool:
    amount = call.args["amount"]
    return isinstance(amount, int) and amount > 1000


def ledger_tools(ledger: EffectLedger, log: Path) -> list[Any]:
    """The agent's tools, registered on ``ledger``: each run appends to ``log``."""

    @ledger.tool("mail.send_reminder")
    async def send_reminder(person: str) -> str:
        """Email a person a reminder."""
        with log.open("a") as f:
            f.write(f"reminder {person}\n")
        return f"reminder sent to {person}"

    @ledger.tool("payments.refund", requires_approval=over_1000)
    async def refund(order_id: str, amount: int) -> str:
        """Refund an order."""
        with log.open("a") as f:
            f.write(f"refund {order_id}\n")
        return f"refunded {amount} on {order_id}"

    @ledger.tool("rooms.book")
    async def book_room(room: str) -> str:
        """Book a room; the booking system is busy on the first try."""
        with log.open("a") as f:
            f.write(f"book {room}\n")
        if sum(line.startswith("book ") for line in log.read_text().splitlines()) == 1:
            raise ToolException("the booking system is busy; try again")
        return f"booked {room}"

    return [
        as_langchain_tool(send_reminder, name="send_reminder"),
        as_langchain_tool(refund, name="refund"),
        as_langchain_tool(book_room, name="book_room"),
    ]


class CrashAfterTools(AgentMiddleware):
    """Kills the process (or raises ``crash``) right after a tool ran, before
    LangGraph records its result: the moment a crash costs a duplicate."""

    def __init__(self, crash: Callable[[], None]) -> None:
        super().__init__()
        self.crash = crash

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        result = handler(request)
        self.crash()
        return result

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        result = await handler(request)
        self.crash()
        return result


def build_agent(
    ledger: EffectLedger,
    log: Path,
    checkpointer: Any,
    *,
    model: Any = None,
    middleware: list[Any] | None = None,
) -> Any:
    return create_agent(
        model if model is not None else ScriptedChat(reply=script),
        ledger_tools(ledger, log),
        middleware=middleware or [],
        checkpointer=checkpointer,
    )


def config() -> Any:
    return {"configurable": {"thread_id": THREAD}}


def main(directory: Path, phase: str) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from agent_ledger.sync import open_ledger

    ledger = open_ledger(f"sqlite:///{directory / 'ledger.db'}")
    log = directory / "sent.log"

    def die() -> None:
        os._exit(3)

    middleware = [CrashAfterTools(die)] if phase == "crash" else []
    with SqliteSaver.from_conn_string(str(directory / "checkpoints.db")) as saver:
        agent = build_agent(ledger, log, saver, middleware=middleware)
        if phase == "ask":
            result = agent.invoke({"messages": [HumanMessage("refund o7 5000")]}, config())
        elif phase == "approve":
            result = agent.invoke(Command(resume={"approved": True, "by": "ada"}), config())
        elif phase == "crash":
            # durability="sync": each step's checkpoint is on disk before the
            # next step starts, so the crash loses only the running step.
            result = agent.invoke(
                {"messages": [HumanMessage("remind ada")]}, config(), durability="sync"
            )
        elif phase == "recover":
            result = agent.invoke(None, config())
        else:
            raise SystemExit(f"unknown phase {phase!r}")
    pauses = [p.value for p in result.get("__interrupt__", ())]
    effects = [
        {"tool": e.tool, "executions": e.executions, "dedup_count": e.dedup_count}
        for e in ledger.call_sync(ledger.list_effects).effects
    ]
    last = str(result["messages"][-1].content)
    print(orjson.dumps({"last": last, "pauses": pauses, "effects": effects}).decode())
    ledger.close_sync()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
