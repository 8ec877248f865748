"""LangGraph: ledger tools inside a graph pause it for a person, in LangGraph's own way.

A ledger tool given to a graph (``as_langchain_tool`` or
``wrap_langchain_tool``, run by ``langchain.agents.create_agent``,
``langgraph.prebuilt.create_react_agent`` or a ``ToolNode`` of your own)
behaves, inside a graph run, as a LangGraph user expects:

* **Approvals are interrupts.** A call the ledger sends to a person does
  not block the graph (whatever ``wait_for_approval`` says) and does not
  escape ``invoke`` as ``ApprovalPendingError``: it calls LangGraph's
  ``interrupt()`` with an ``ApprovalRequest`` (the effect's tool, args, key
  and why), so the run pauses with the effect pending in the ledger and the
  graph's state in its checkpointer. ``Command(resume={"approved": True,
  "by": "ada", "note": "..."})`` (or ``False`` with a ``"reason"``)
  records that ``Decision`` in the ledger (``decided_by`` is ``by``): the
  call then runs once, or the model gets a ``ToolMessage`` saying a person
  denied it. A decision made elsewhere meanwhile (``agent-ledger approve``)
  stands: the resumed call finds it and asks nobody. LangGraph re-runs a
  paused node from its start on resume; every other ledger call in it is
  answered from its receipt.
* **The thread is the workflow.** A call with no workflow of its own
  (``@ledger.tool(workflow_id=...)``) and no ``ledger.workflow(...)``
  around it belongs to the graph's thread (``config["configurable"]
  ["thread_id"]``), so a resumed or restarted thread finds its receipts.
* **Denials are the model's to read.** Inside a graph, a denied or
  canceled call answers the model (``ToolMessage(status="error")``, with
  ``for_model``'s text) instead of failing the run.

``LedgerApprovals`` makes LangChain's ``HumanInTheLoopMiddleware`` and the
ledger one decision (see its doc), ``handle_tool_errors`` is a ``ToolNode``
error handler that keeps the ledger's outcomes for the application, and
``agent_ledger.adapters.langchain.LedgerChatModel`` records the graph's
model calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final

from agent_ledger.adapters._common import missing_extra

try:
    from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import InjectedToolArg, ToolException
    from langgraph.config import get_config
    from langgraph.prebuilt import ToolRuntime
    from langgraph.types import interrupt
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing_extra(__name__, "LangGraph and LangChain 1.x", "langgraph") from exc
from pydantic import BaseModel, ConfigDict, StrictBool

from agent_ledger.adapters._messages import failure_text, for_model, retryable_text
from agent_ledger.context import (
    approved_by_framework,
    current_turn,
    current_workflow,
    framework_approval,
)
from agent_ledger.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerError,
    EffectLedgerValidationError,
)
from agent_ledger.options import RunOptions
from agent_ledger.tools import workflow_scope

if TYPE_CHECKING:
    from langchain.agents.middleware.types import ToolCallRequest
    from langgraph.types import Command

    from agent_ledger.adapters.langchain import _Call

__all__ = [
    "RUNTIME_ANNOTATION",
    "ApprovalRequest",
    "Decision",
    "GraphCall",
    "LedgerApprovals",
    "current_thread",
    "graph_call",
    "handle_tool_errors",
]

#: The hidden ``ToolRuntime`` field every ledger tool has where LangGraph is
#: installed (``agent_ledger.adapters.langchain.RUNTIME_FIELD``): injected by
#: a ``ToolNode``, never shown to the model; None outside a ``ToolNode``.
RUNTIME_ANNOTATION: Final = Annotated[ToolRuntime | None, InjectedToolArg]

#: LangGraph's key for the running task's scratchpad: present in a config
#: only inside a graph's task, where ``interrupt()`` can pause it.
_SCRATCHPAD: Final = "__pregel_scratchpad"
#: LangGraph's key for the running task's channel reader (``read(channel, fresh)``).
_READ: Final = "__pregel_read"

#: Inside a graph nothing waits for a person: the interrupt is the wait.
_NO_WAIT: Final = RunOptions(wait_for_approval=False)


class Decision(BaseModel):
    """A person's answer to an ``ApprovalRequest``: ``Command(resume={...})``'s value.

    ``approved`` is required (``True`` or ``False``, nothing that merely
    looks like one); ``by`` is recorded as who decided; ``note`` goes with an
    approval and ``reason`` (or ``note``) with a denial, which the model
    reads. Anything else is refused: LangGraph raises the
    ``ValidationError`` from ``invoke``, nothing is recorded, and the same
    interrupt can be answered again.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approved: StrictBool
    by: str | None = None
    note: str | None = None
    reason: str | None = None


class ApprovalRequest(BaseModel):
    """What the graph's ``interrupt()`` carries for a call waiting for a person.

    Read it from ``result["__interrupt__"][0].value`` (a dict once
    checkpointed) and answer with a ``Decision``. ``key`` is the effect's
    idempotency key: ``agent-ledger show KEY`` and ``ledger.approve(KEY)``
    take it too.
    """

    model_config = ConfigDict(frozen=True)

    #: Always ``"agent_ledger.approval"``: tells this interrupt from others.
    type: str = "agent_ledger.approval"
    #: The ledger tool's name (in every key) and its arguments as recorded.
    tool: str
    args: dict[str, Any]
    key: str
    workflow_id: str
    #: The framework's tool-call id of the call that asked.
    tool_call_id: str | None
    #: Why it waits, in words.
    reason: str


def current_thread() -> str | None:
    """The thread id of the graph run this code is in, or None outside one (or without one)."""
    configurable = _configurable()
    thread = None if configurable is None else configurable.get("thread_id")
    return None if thread is None else str(thread)


def _configurable() -> dict[str, Any] | None:
    """The running graph task's ``configurable``, or None when not inside a graph's task."""
    try:
        config = get_config()
    except RuntimeError:  # not in a runnable context at all
        return None
    configurable = config.get("configurable") or {}
    return configurable if _SCRATCHPAD in configurable else None


def graph_call(call: _Call) -> GraphCall | None:
    """The graph run ``call`` is made in, or None when it is not inside one.

    Inside a graph is where ``interrupt()`` can pause: a task of a compiled
    graph (``ToolNode`` in ``create_agent``, ``create_react_agent`` or a
    graph of your own). A ``ToolNode``-less call (``tool.invoke`` from
    your own node) is inside one too, without the ``ToolRuntime``.
    """
    configurable = _configurable()
    if configurable is None:
        return None
    thread = configurable.get("thread_id")
    return GraphCall(call, None if thread is None else str(thread))


@dataclass(slots=True)
class GraphCall:
    """One ledger tool call made inside a graph run: the adapter's way of running it there."""

    call: _Call
    #: The graph's thread (``config["configurable"]["thread_id"]``), if it has one.
    thread_id: str | None

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        """The call's workflow and turn: the thread as the workflow when nothing
        else names one, and the human message that started the turn as the turn
        when the workflow block around the call gave none."""
        tool = self.call.tool
        workflow = tool.workflow_id or current_workflow() or self.thread_id
        if workflow is None:
            # No workflow at all: the run raises EffectLedgerValidationError
            # naming the fix, as outside a graph.
            yield
            return
        turn = current_turn(workflow) or self.turn()
        if turn is None and tool.scope is None:
            raise self._no_turn()
        if workflow == current_workflow() and turn == current_turn(workflow):
            yield
            return
        with workflow_scope(tool.ledger, workflow, turn=turn):
            yield

    def turn(self) -> str | None:
        """The id of the human message that started this call's turn: the last
        ``HumanMessage`` before the ``AIMessage`` that made the call, in the
        graph's state (read from the ``ToolRuntime``, or, for a call a node of
        your own makes with ``tool.invoke``, from the running task's view of
        the graph's ``messages``); None where there is none."""
        messages = _messages_of(getattr(self.call.runtime, "state", None))
        if messages is None and self.call.runtime is None:
            messages = _task_messages()
        if messages is None:
            return None
        end = len(messages)
        call_id = self.call.call_id
        if call_id is not None:
            for i in range(len(messages) - 1, -1, -1):
                message = messages[i]
                if isinstance(message, AIMessage) and any(
                    c.get("id") == call_id for c in message.tool_calls
                ):
                    end = i
                    break
        for message in reversed(messages[:end]):
            if isinstance(message, HumanMessage):
                return message.id
        return None

    def _no_turn(self) -> EffectLedgerValidationError:
        """The error for a call in a graph whose turn nobody can tell: keyed once
        per workflow instead, a later request would silently get an earlier result."""
        tool = self.call.tool
        return EffectLedgerValidationError(
            f"tool {tool.name!r} was called inside a LangGraph run, but the ledger cannot "
            "tell which turn (user request) the call belongs to: the graph's state has no "
            "'messages' list with a HumanMessage before the call. Keyed once per workflow "
            "instead, a later request with the same arguments would silently get the "
            "earlier result. Run the tool through a ToolNode (create_agent, "
            "create_react_agent), give the turn with `with ledger.workflow(thread_id, "
            "turn=request_id):` around the call, or declare the tool's scope "
            '(@ledger.tool(scope="workflow") for once per workflow ever, "call" for once '
            "per tool-call id). Nothing was stored.",
            field="turn",
        )

    async def arun(self, run: Callable[[RunOptions | None], Awaitable[object]]) -> object:
        """Run the call (``run(options)``, one ledger call) the way a graph needs it."""
        approver = framework_approval()
        with self._scope():
            while True:
                try:
                    return await run(_options(approver))
                except ApprovalPendingError as pending:
                    decision = self._decide(pending, approver)
                    approver = None  # the framework's approval counts once
                    await _record(self.call.tool.ledger, pending, decision)
                except EffectDeniedError as denied:
                    return self._denied(denied)
                except ToolException as failed:
                    return self._failed(failed)

    def run_sync(self, run: Callable[[RunOptions | None], object]) -> object:
        """``arun`` for a graph run from sync code (``graph.invoke``)."""
        approver = framework_approval()
        ledger = self.call.tool.ledger
        with self._scope():
            while True:
                try:
                    return run(_options(approver))
                except ApprovalPendingError as pending:
                    # interrupt() here, in the graph's thread and context; the
                    # ledger's own loop only records the decision.
                    decision = self._decide(pending, approver)
                    approver = None
                    ledger.call_sync(_record, ledger, pending, decision)
                except EffectDeniedError as denied:
                    return self._denied(denied)
                except ToolException as failed:
                    return self._failed(failed)

    def _decide(self, pending: ApprovalPendingError, approver: str | None) -> Decision:
        """The decision on a pending call: the framework's approval if it gave
        one, else a person's, through ``interrupt()`` (which pauses the graph
        the first time, and returns the ``Command(resume=...)`` value after)."""
        if approver is not None:
            return Decision(
                approved=True, by=approver, note="approved through HumanInTheLoopMiddleware"
            )
        effect = pending.effect
        request = ApprovalRequest(
            tool=effect.tool,
            args=dict(effect.args),
            key=effect.idem_key,
            workflow_id=effect.workflow_id,
            tool_call_id=self.call.call_id,
            reason=(
                f"tool {effect.tool!r} needs a person's approval for these arguments; "
                'resume with {"approved": true|false, "by": ..., "note"/"reason": ...}'
            ),
        )
        answer = interrupt(request.model_dump(), response_schema=Decision)
        return answer if isinstance(answer, Decision) else Decision.model_validate(answer)

    def _failed(self, failed: ToolException) -> object:
        """A ``ToolException`` (the model's error to read: LangChain's retry signal)
        answers the model as an error ``ToolMessage``, whatever ``ToolNode``'s
        ``handle_tool_errors`` says; without a tool-call id it is raised."""
        call = self.call
        if call.call_id is None:
            raise failed
        return ToolMessage(
            str(failed), tool_call_id=call.call_id, name=_langchain_name(call), status="error"
        )

    def _denied(self, denied: EffectDeniedError) -> object:
        """A denied (or canceled) call answers the model, when it is this call's own
        outcome and the call came from a model (it has a tool-call id)."""
        call = self.call
        if call.call_id is None or denied.effect.idem_key != call.key():
            raise denied
        text = for_model(denied) or str(denied)
        return ToolMessage(
            text, tool_call_id=call.call_id, name=_langchain_name(call), status="error"
        )


def _messages_of(state: object) -> list[Any] | None:
    """The ``messages`` list of a graph state (a dict or an object), or None."""
    messages = state.get("messages") if isinstance(state, dict) else None
    if messages is None:
        messages = getattr(state, "messages", None)
    return messages if isinstance(messages, list) else None


def _task_messages() -> list[Any] | None:
    """The graph's ``messages`` as the running task saw them when it started (what a
    ``ToolNode``'s ``ToolRuntime.state`` holds), for a call made without a runtime.

    Read through the task's own channel reader in its config (LangGraph's
    ``__pregel_read``, as ``_SCRATCHPAD`` is read); None outside a graph task,
    in a graph without a ``messages`` channel, or if LangGraph reads otherwise.
    """
    configurable = _configurable()
    read = None if configurable is None else configurable.get(_READ)
    if not callable(read):
        return None
    try:
        messages = read("messages", False)
    except Exception:  # no such channel, or another LangGraph: no turn, said loudly
        return None
    return messages if isinstance(messages, list) else None


def _options(approver: str | None) -> RunOptions:
    """The run's options: never wait; a call the framework's human-in-the-loop
    approved waits for that decision, so the ledger records it."""
    if approver is None:
        return _NO_WAIT
    return RunOptions(wait_for_approval=False, requires_approval=True)


def _langchain_name(call: _Call) -> str:
    from agent_ledger.adapters.langchain import _langchain_name as name_of

    return name_of(call.tool.name)


async def _record(ledger: Any, pending: ApprovalPendingError, decision: Decision) -> None:
    """Record ``decision`` on the pending effect, as ``approve``/``deny`` would.

    A decision made meanwhile by someone else stands (the store's
    transition is made once): the call then finds the effect ready, denied
    or done, and answers from it.
    """
    key = pending.idem_key
    if decision.approved:
        await ledger.approve(key, by=decision.by, note=decision.note)
    else:
        await ledger.deny(key, decision.reason or decision.note, by=decision.by)


class LedgerApprovals(AgentMiddleware):
    """LangChain's ``HumanInTheLoopMiddleware`` and the ledger: one decision, not two.

    Give it the agent's ``HumanInTheLoopMiddleware``, in the same
    ``middleware`` list::

        hitl = HumanInTheLoopMiddleware(interrupt_on={"payments_charge": True})
        agent = create_agent(model, tools, middleware=[hitl, LedgerApprovals(hitl)],
                             checkpointer=saver)

    The middleware asks; the ledger records. A ledger tool call the
    middleware gates (its tool in ``interrupt_on``, its ``when`` saying
    yes) reaches the tool only once the person approved it (or edited it:
    the edited call is the one recorded), so the ledger takes that approval
    as its own: the effect is recorded as needing approval and approved by
    ``by`` (a string, or a function of the ``ToolCallRequest``, say reading
    the user from ``request.runtime.context``), and runs; the ledger's
    ``interrupt()`` never asks again. A call the person rejects never
    reaches the tool, so the ledger stores nothing for it (the middleware
    answers the model). A ledger call the middleware does not gate asks
    through the ledger's own interrupt when its policy says so.
    """

    def __init__(
        self,
        hitl: HumanInTheLoopMiddleware,
        *,
        by: str | Callable[[ToolCallRequest], str] = "HumanInTheLoopMiddleware",
    ) -> None:
        if not isinstance(hitl, HumanInTheLoopMiddleware):
            raise EffectLedgerValidationError(
                f"LedgerApprovals takes the agent's HumanInTheLoopMiddleware, got {hitl!r}",
                field="hitl",
            )
        if not (isinstance(by, str) and by) and not callable(by):
            raise EffectLedgerValidationError(
                f"LedgerApprovals(by=...) must be a non-empty string or a function of the "
                f"tool-call request, got {by!r}",
                field="by",
            )
        super().__init__()
        self.hitl = hitl
        self.by = by

    def _approver(self, request: ToolCallRequest) -> str | None:
        """Who approved ``request`` through the middleware, or None if it did not gate it.

        The middleware decided on the call as the model made it (its ``when``
        was asked about that one), which a person's edit may have changed
        since: the gate is judged on the model's call, read from the
        ``AIMessage`` in the graph's state, so an edited call the person
        already decided on is not asked about again.
        """
        asked = _as_the_model_made_it(request)
        if asked is None:
            return None  # which call the person saw cannot be told: the ledger asks itself
        config = self.hitl.interrupt_on.get(asked.tool_call["name"])
        if config is None:
            return None
        when = config.get("when")
        if when is not None and not when(asked):
            return None
        by = self.by(request) if callable(self.by) else self.by
        if not isinstance(by, str) or not by:
            raise EffectLedgerValidationError(
                f"LedgerApprovals(by=...) returned {by!r}; it must return who approved, "
                "as a non-empty string",
                field="by",
            )
        return by

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        by = self._approver(request)
        if by is None:
            return handler(request)
        with approved_by_framework(by):
            return handler(request)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        by = self._approver(request)
        if by is None:
            return await handler(request)
        with approved_by_framework(by):
            return await handler(request)


def _as_the_model_made_it(request: ToolCallRequest) -> ToolCallRequest | None:
    """``request`` with the tool call as the model made it (the ``AIMessage`` in the
    graph's state that has its id), before a reviewer's edit; ``request`` itself
    when that call is not found or is the same.

    None when that cannot be told: the model's message has several calls with
    this id (a model that numbers ids per message, or repeats one) and none is
    this call as it stands (same name and arguments), so it is an edit of one
    of them, and of which one is a guess. Guessing could approve a call the
    person never saw, so the middleware's decision is not inferred for it.
    """
    call_id = request.tool_call.get("id")
    messages = _messages_of(request.state)
    if not call_id or messages is None:
        return request
    current = request.tool_call
    for message in reversed(messages):
        if not isinstance(message, AIMessage):
            continue
        made = [call for call in message.tool_calls if call.get("id") == call_id]
        if not made:
            continue
        if any(m["name"] == current["name"] and m["args"] == current["args"] for m in made):
            return request
        if len(made) > 1:
            return None
        return request.override(tool_call=made[0])
    return request


def handle_tool_errors(error: Exception) -> str:
    """A ``ToolNode(handle_tool_errors=...)`` handler that keeps the ledger's outcomes
    for the application.

    ``handle_tool_errors=True`` tells the model about every exception and
    lets the run go on, so a budget refusal or a replay that diverged would
    end the run as if nothing happened. This handler tells the model about
    the tool's own errors (as ``True`` does) and re-raises the ledger's
    (``BudgetExceededError``, ``UnrecordedEffectError``, every other
    ``EffectLedgerError``), which then leave ``invoke``. Pending approvals
    never reach a handler inside a graph: they are interrupts.
    """
    if isinstance(error, EffectFailedError):
        # The tool's own failure, recorded: the model's to read, with what calling
        # again does (the shared wording every adapter uses).
        if error.retryable:
            return f"Error: {retryable_text(error, error.effect.idem_key)}"
        return f"Error: {failure_text(error)}"
    if isinstance(error, (EffectLedgerError, BudgetExceededError)):
        raise error
    return f"Error: {error!r}\n Please fix your mistakes."
