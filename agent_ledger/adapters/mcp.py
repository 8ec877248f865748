"""MCP: serve ledger tools from an MCP server, each ``tools/call`` one ledger run.

``add_tools(server, ledger)`` registers every tool of ``ledger.tools`` on an
``MCPServer`` (the ``mcp`` SDK's high-level server, called ``FastMCP`` before
mcp 2); ``add_tool(server, tool)`` one tool, with its own name or title.
Each is served under a name model APIs accept (``payments.charge`` as
``payments_charge``, OpenAI's rule ``^[a-zA-Z0-9_-]{1,64}$``), so a client
that forwards MCP tools to a model (an Agents SDK agent) can; the receipt
keeps the ledger name. The
input schema comes from the function's signature (``effect`` left out), and
every call goes through ``Tool.invoke`` with the request's JSON-RPC id as
the effect's ``call_id`` (never part of the key).

Idempotent: a ledger tool runs at most once per key, and its key is made of
its workflow, its name and its arguments, so a client that sends the same
call again (a retry after a timeout, a model repeating itself) gets the first
call's result and nothing runs again. Every tool is therefore annotated
``idempotentHint=True``, which tells clients (they treat annotations as hints)
that retrying it is safe. That holds as long as a retry lands in the same
workflow: with a ``workflow_id`` function that gives each request a workflow
of its own, pass ``annotations=ToolAnnotations(idempotent_hint=False)``.

A client that times out cancels its request and retries it: the run is not
cut off with the request, but finishes in a task of its own and records its
outcome, which the retry waits for or replays (see ``_outlive_request``).

What the client reads (``isError`` results, text written for a model):

* arguments the tool does not take, missing or of the wrong type, or that a
  key cannot hold (an integer beyond 64 bits, over ``max_args_size_bytes``):
  nothing is stored, and the result says what was wrong;
* a call waiting for a person's approval: with ``wait_for_approval=False``
  (the default here: a ``tools/call`` request should not hang for hours,
  and clients time out) the result says so and nothing ran; the same call
  sent again after ``approve()`` runs once;
* a denied (or canceled) call: the result says so (and, for one canceled
  after it started, that it may have taken effect), and sending it again
  runs nothing;
* a payload mismatch, or a wait for another caller that timed out;
* a call its workflow's budget refused: that nothing ran, and why;
* the tool's own ``ToolError`` (``mcp.server.mcpserver.exceptions``), the
  SDK's "error for the model", on the first call and on every replay (the
  last try's, when a retry policy's tries ran out);
* any other exception from the tool: that the call failed, its error code
  (the exception's ``code`` or class name) and receipt, and that sending it
  again gives the same answer; the exception's text stays on the server,
  which logs its traceback once, on the call that failed (a replay logs
  one line at INFO, no traceback).

The SDK validates arguments into Python objects (an enum member, a
``date``, a pydantic model); they are turned back into their JSON before
the key is made, and the tool receives that JSON, as from every adapter.

What is the server's to fix (no workflow, a store that is down, a replay
that went off its recording) is a crash, as the SDK treats one: the client
reads only "Error executing tool NAME" and the server logs it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from agent_ledger.adapters._common import MalformedToolCall, missing_extra

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing_extra(__name__, "the MCP Python SDK (mcp 2)", "mcp") from exc

from agent_ledger.adapters._messages import (
    budget_text,
    failure_text,
    first_raised,
    for_model,
    raised_as,
)
from agent_ledger.adapters._outcome import call_key, is_tool_failure, recorded_failure
from agent_ledger.adapters._schema import model_name
from agent_ledger.adapters._signature import (
    REQUIRED,
    JsonArguments,
    arguments,
    check_storable,
    description,
    dressed,
    refuse_names,
    return_annotation,
)
from agent_ledger.errors import (
    BudgetExceededError,
    EffectFailedError,
    EffectLedgerValidationError,
)
from agent_ledger.ledger import EffectLedger
from agent_ledger.options import RunOptions
from agent_ledger.tools import Tool, workflow_scope

__all__ = ["WorkflowFor", "add_tool", "add_tools"]

_log = logging.getLogger(__name__)

#: Runs whose request was cancelled while they ran, held until they settle: the
#: event loop keeps only weak references to tasks.
_DETACHED: set[asyncio.Task[Any]] = set()

#: A workflow id for each call, from the request's MCP ``Context`` (its session, a header...).
WorkflowFor = Callable[[Context[Any, Any]], str]


def add_tools(
    server: MCPServer[Any],
    tools: EffectLedger | Iterable[Tool[Any]],
    *,
    workflow_id: str | WorkflowFor | None = None,
    wait_for_approval: bool = False,
    annotations: ToolAnnotations | None = None,
) -> None:
    """Register ledger tools on ``server``: every tool of a ledger, or the ones given.

    Each is ``add_tool(server, tool, ...)`` with these options, except that
    a tool with a workflow of its own (``@ledger.tool(workflow_id=...)``)
    keeps it: ``workflow_id`` applies to the others. The ledger's tools are
    taken as they are now (register tools first). Nothing is registered if
    one of ``tools`` is not a ledger tool, is given twice, or has a name the
    server already has a tool under.
    """
    found = list(tools.tools.values()) if isinstance(tools, EffectLedger) else list(tools)
    names: dict[str, Tool[Any]] = {}
    for tool in found:
        _check_tool(tool)
        mcp_name = model_name(tool)
        _check_name(server, mcp_name)
        other = names.setdefault(mcp_name, tool)
        if other is tool and sum(t is tool for t in found) == 1:
            continue
        if other.name == tool.name:
            raise EffectLedgerValidationError(
                f"tool {tool.name!r} is given twice; nothing was registered", field="tools"
            )
        raise EffectLedgerValidationError(
            f"tools {other.name!r} and {tool.name!r} would both be called {mcp_name!r}; "
            "nothing was registered. Register them one by one with add_tool(name=...)",
            field="tools",
        )
    for tool in found:
        add_tool(
            server,
            tool,
            workflow_id=workflow_id if tool.workflow_id is None else None,
            wait_for_approval=wait_for_approval,
            annotations=annotations,
        )


def add_tool(
    server: MCPServer[Any],
    tool: Tool[Any],
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    annotations: ToolAnnotations | None = None,
    workflow_id: str | WorkflowFor | None = None,
    wait_for_approval: bool = False,
) -> None:
    """Register one ledger tool on ``server``; its ``tools/call`` requests run through the ledger.

    ``name`` defaults to the ledger tool's name as model APIs take it
    (``payments.charge`` is served as ``payments_charge``: MCP allows dots,
    but OpenAI's tool names, ``^[a-zA-Z0-9_-]{1,64}$``, do not, and an
    Agents SDK agent forwards MCP tools under their MCP names); the receipt
    keeps the ledger name. Pass ``name=tool.name`` to serve the dotted name.
    ``description`` defaults to the function's docstring. A name the server already
    has a tool under is refused (``EffectLedgerValidationError``; nothing
    is registered): the SDK would keep the other tool, and calls would not
    go through the ledger. ``annotations`` are
    passed on with ``idempotent_hint=True`` unless they set it (see the
    module doc).

    The workflow of a call is, in this order: the tool's own
    (``@ledger.tool(workflow_id=...)``; giving ``workflow_id`` here too is
    refused), ``workflow_id`` (a string, or a function of the request's
    ``Context``), else the ``ledger.workflow(...)`` scope the server runs in.
    A call with none is a server error, logged by the server.

    ``wait_for_approval=True`` makes a call that needs approval wait for the
    person (within the client's request timeout) instead of answering at
    once that it is pending.
    """
    if not isinstance(server, MCPServer):
        raise EffectLedgerValidationError(
            f"add_tool registers on an mcp MCPServer, got {server!r}", field="server"
        )
    _check_tool(tool)
    if tool.workflow_id is not None and workflow_id is not None:
        raise EffectLedgerValidationError(
            f"tool {tool.name!r} belongs to workflow {tool.workflow_id!r} (its workflow_id=), "
            "so a workflow_id given to add_tool would never be used; give one or the other",
            field="workflow_id",
        )
    if workflow_id is not None and not isinstance(workflow_id, str) and not callable(workflow_id):
        raise EffectLedgerValidationError(
            f"workflow_id must be a string or a function of the MCP Context, got {workflow_id!r}",
            field="workflow_id",
        )
    refuse_names(tool, "MCP")
    mcp_name = model_name(tool) if name is None else name
    fn = _function_for(tool, workflow_id, wait_for_approval)
    _check_name(server, mcp_name)
    server.add_tool(
        fn,
        name=mcp_name,
        title=title,
        description=_describe(tool) if description is None else description,
        annotations=_idempotent(annotations),
    )


def _check_tool(tool: object) -> None:
    if not isinstance(tool, Tool):
        raise EffectLedgerValidationError(
            f"expected a ledger tool (from @ledger.tool), got {tool!r}", field="tool"
        )


def _check_name(server: MCPServer[Any], name: str) -> None:
    """Refuse a name the server already has a tool under.

    The SDK keeps the tool it has and only logs a warning, so calls of that
    name would reach the other tool (an unprotected version, say) and never
    the ledger. The SDK has no public lookup; its tool manager's is the one
    its own request handling uses.
    """
    if server._tool_manager.get_tool(name) is not None:
        raise EffectLedgerValidationError(
            f"the server already has a tool named {name!r}, and the SDK would keep it, so "
            "calls would not go through the ledger; nothing was registered. Remove it first "
            "(server.remove_tool(name)) or register this tool under another name (name=...)",
            field="name",
        )


def _idempotent(annotations: ToolAnnotations | None) -> ToolAnnotations:
    if annotations is None:
        return ToolAnnotations(idempotent_hint=True)
    if annotations.idempotent_hint is None:
        return annotations.model_copy(update={"idempotent_hint": True})
    return annotations


def _describe(tool: Tool[Any]) -> str:
    return description(tool) or f"Runs {tool.name} (recorded by agent-ledger)."


def _function_for(
    tool: Tool[Any], workflow_id: str | WorkflowFor | None, wait_for_approval: bool
) -> Callable[..., Any]:
    """The function the server calls: the tool's parameters plus the request ``Context``.

    The SDK builds the input schema and validates arguments from its
    signature and annotations, which are the tool function's, less
    ``effect``.
    """
    options = None if wait_for_approval else RunOptions(wait_for_approval=False)
    ledger = tool.ledger
    params = arguments(tool)
    names = frozenset(p.name for p in params)
    context_name = _unused("ctx", names)
    to_json = JsonArguments(tool.name, {p.name: p.annotation for p in params})

    def scope(ctx: Context[Any, Any]) -> AbstractContextManager[object]:
        if workflow_id is None:
            return nullcontext()
        return workflow_scope(
            ledger, workflow_id if isinstance(workflow_id, str) else workflow_id(ctx)
        )

    async def call_ledger_tool(**kwargs: Any) -> Any:
        ctx: Context[Any, Any] = kwargs.pop(context_name)
        call_id, sent = _request(ctx)
        # The SDK ignores arguments the schema does not name; for a tool with
        # side effects a misspelt argument must not run it with a default.
        unknown = sorted(set(sent) - names) if sent is not None else []
        if unknown:
            raise ToolError(
                f"unexpected arguments {unknown}; the tool's parameters are {sorted(names)}. "
                "Nothing ran and nothing was stored."
            )
        try:
            # The SDK validated the arguments into Python objects (an enum
            # member, a date, a model): the key and the tool get their JSON.
            values = tool.bind_arguments(to_json(kwargs, tool.name))
        except EffectLedgerValidationError as exc:
            raise ToolError(str(exc)) from None
        try:
            check_storable(tool, values)
        except MalformedToolCall as exc:
            raise ToolError(str(exc)) from None
        with scope(ctx):
            here = contextvars.copy_context()  # to work out the key, if the run fails
            # The task copies this context (the workflow scope) when it is made.
            run = asyncio.create_task(
                tool.invoke(values, call_id=call_id, run_options=options),
                name=f"agent-ledger mcp {tool.name} request {call_id}",
            )
        try:
            return await _outlive_request(run, tool.name, call_id)
        except Exception as exc:
            answer = await _answer(tool, here, values, exc)
            if answer is exc:
                raise
            raise answer from exc

    parameters = [
        inspect.Parameter(
            p.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=p.default,
            annotation=p.annotation,
        )
        for p in params
    ]
    parameters.append(
        inspect.Parameter(context_name, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    )
    returns = return_annotation(tool)
    # The SDK reads both the signature and the type hints (to find the Context).
    call_ledger_tool.__annotations__ = {p.name: p.annotation for p in parameters}
    if returns is not REQUIRED:
        call_ledger_tool.__annotations__["return"] = returns
    return dressed(
        call_ledger_tool,
        tool.name,
        description(tool) or None,
        inspect.Signature(
            parameters,
            return_annotation=inspect.Signature.empty if returns is REQUIRED else returns,
        ),
    )


async def _answer(
    tool: Tool[Any], here: contextvars.Context, values: dict[str, object], error: Exception
) -> Exception:
    """What to raise for a run that raised ``error``: the client reads the same every time.

    The tool's own exception (a ledger error of a tool call inside it
    included, see ``_outcome``) is answered from the effect's recorded
    failure, as every replay is: its message when it was a ``ToolError``,
    else that the call failed, with the error code and the receipt but not
    the exception's text (a crash's text stays on the server, which logs
    its traceback once, on the call that crashed). This call's own ledger
    outcomes are told in a model's terms (``for_model``, a budget refusal
    too); anything else (no workflow, a store that is down, a replay that
    went off its recording) is the server's error.
    """
    try:
        key: str | None = here.run(call_key, tool, values)
    except EffectLedgerValidationError:
        key = None
    if await is_tool_failure(tool.ledger, key, error):
        failure = None if key is None else await recorded_failure(tool.ledger, key)
        if failure is not None and not raised_as(failure, ToolError):
            _log.error(
                "tool %r failed; its failure is recorded (effect %s…)",
                tool.name,
                failure.effect.idem_key[:12],
                exc_info=error,
            )
        return _failure_answer(failure, error)
    if isinstance(error, EffectFailedError):  # a replay of this call's failure
        return _failure_answer(error, error)
    if isinstance(error, BudgetExceededError):
        return ToolError(budget_text(error))
    text = for_model(error)
    return error if text is None else ToolError(text)


def _failure_answer(failure: EffectFailedError | None, error: Exception) -> Exception:
    """A recorded failure as the client reads it: a ``ToolError``'s own message, or
    ``failure_text`` without the exception's text. No record: ``error`` as it is."""
    if failure is None:
        return error
    if raised_as(failure, ToolError):
        return ToolError(first_raised(failure)[1])
    return ToolError(failure_text(failure, show_message=False))


async def _outlive_request(run: asyncio.Task[Any], name: str, call_id: str | None) -> Any:
    """``run``'s outcome; if the request is cancelled first, ``run`` goes on without it.

    A client cancels a request (``notifications/cancelled``) when it stops
    waiting, on a read timeout above all, and then retries it: the tools are
    annotated idempotent. Cancelling the run with the request would cut the
    side effect off midway and record the effect canceled, so every retry
    would read "stopped while it was running" and never get a result. So the
    run finishes in a task of its own and records its outcome, which a
    retry replays (or waits for, while it still runs). A run still going
    when the event loop shuts down is cancelled then, and recorded canceled,
    as any run cut off is.
    """
    try:
        return await asyncio.shield(run)
    except asyncio.CancelledError:
        if not run.done():
            _DETACHED.add(run)
            run.add_done_callback(lambda task: _settled(task, name, call_id))
        raise


def _settled(run: asyncio.Task[Any], name: str, call_id: str | None) -> None:
    """Log how a run its request stopped waiting for ended (nobody else will read it)."""
    _DETACHED.discard(run)
    if run.cancelled():
        _log.warning(
            "tool %r (request %s) was cancelled after its client stopped waiting; "
            "its effect is recorded canceled",
            name,
            call_id,
        )
        return
    error = run.exception()
    if error is not None:
        _log.warning(
            "tool %r (request %s) ended with an error after its client stopped waiting; "
            "a retry of the call reads its recorded outcome",
            name,
            call_id,
            exc_info=error,
        )


def _request(ctx: Context[Any, Any]) -> tuple[str | None, Mapping[str, Any] | None]:
    """The request's id and its arguments as sent, or (None, None) outside a request.

    ``MCPServer.call_tool`` called from code has no request, hence no id.
    """
    try:
        request = ctx.request_context
    except ValueError:
        return None, None
    sent = request.params.get("arguments") if request.params is not None else None
    call_id = None if request.request_id is None else str(request.request_id)
    return call_id, sent if isinstance(sent, Mapping) else None


def _unused(name: str, taken: frozenset[str]) -> str:
    while name in taken:
        name += "_"
    return name
