"""Run the tool calls of one model turn and say, for each, what the model reads back.

The OpenAI and Anthropic adapters differ only in how a call is spelled
and how a result is wrapped; what happens in between is this module.

* **Concurrently, answered in order.** A model that asks for several
  calls in one turn treats them as independent (OpenAI's parallel tool
  calls), so they run together (``asyncio.gather``); the results come back
  in the calls' order. Duplicates among them (one key) run once: the
  others wait for it and replay its result.
* **Every call settles before anything is raised.** A call that must stop
  the application (below) does not cancel its siblings: a charge half done
  would be left canceled. They finish, are recorded, and then the first
  such exception, in the calls' order, is raised. Nothing is lost:
  dispatching the same calls again replays what ran.
* **What the model can fix is a result; what a person or the application
  must handle is raised.** Results: malformed calls (bad JSON, an unknown
  tool, arguments that do not bind, arguments the ledger cannot keep as
  sent: over ``max_args_size_bytes``, nested too deep, integers beyond 64
  bits, NaN or Infinity, lone surrogates, keys that are not strings;
  checked before anything is stored, and nothing is), the tool's own
  exception and a result that is not JSON (both recorded as the effect's
  failure, and read back from that record, so the first answer is the
  words every replay's ``EffectFailedError`` gives: a retried tool reads
  ``retries_exhausted``, not its last try's exception; a ledger error
  about another effect, from a tool call inside the tool, counts as the
  tool's own exception: see ``_outcome``), a payload mismatch (nothing ran),
  and a denial (a person said no, or canceled the effect before it ran: the
  model reads who decided nothing runs, and why; Anthropic's ``is_error``).
  Raised: ``EffectDeniedError`` for an effect canceled after its handler
  started (it may have taken effect: the application must find out),
  ``ApprovalPendingError`` (with ``wait_for_approval=False``),
  ``EffectTimeoutError``, store and validation errors of the application's
  own making (a call outside a workflow, a name two registered tools
  answer to), and cancellation.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Final, ParamSpec, TypeVar, cast

import orjson

from agent_ledger.adapters._common import MalformedToolCall, parse_arguments
from agent_ledger.adapters._messages import for_model, may_have_run
from agent_ledger.adapters._outcome import call_key, is_tool_failure, recorded, recorded_failure
from agent_ledger.adapters._schema import find_model_tool
from agent_ledger.errors import (
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
)
from agent_ledger.options import RunOptions, merge_run_options

if TYPE_CHECKING:
    from agent_ledger.ledger import EffectLedger
    from agent_ledger.tools import Tool

__all__ = ["ModelCall", "Reply", "blocking", "call_of", "dispatch", "field"]

#: What an SDK reads back for one call (``dispatch``'s ``answer``).
_A = TypeVar("_A")

#: How an error result starts, so a model reading plain text (OpenAI has no
#: error flag) tells it from a tool's output.
ERROR_PREFIX: Final = "Error: "


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One tool call as the model sent it, whatever the SDK's spelling."""

    #: The framework's id for the call: recorded as ``call_id``, echoed in the result.
    call_id: str
    name: str
    #: JSON text (OpenAI) or an already-decoded object (Anthropic); anything
    #: else is answered as malformed.
    arguments: object


@dataclass(frozen=True, slots=True)
class Reply:
    """What the model reads back for one call."""

    call: ModelCall
    #: The result as text: a string as returned, anything else as JSON.
    content: str
    #: True when ``content`` explains an error rather than carries a result.
    is_error: bool = False


def field(item: object, name: str) -> object:
    """``item[name]`` for a dict, ``item.name`` for an SDK object; None when absent."""
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def call_of(
    item: object, *, what: str, id_field: str, name: object, arguments: object
) -> ModelCall:
    """A ``ModelCall`` from an SDK item's parts, checking what the SDK guarantees.

    A missing id or name is not the model's doing (the APIs always send
    them): it raises ``EffectLedgerValidationError`` before anything runs.
    """
    call_id = field(item, id_field)
    if not isinstance(call_id, str) or not call_id:
        raise EffectLedgerValidationError(
            f"a {what} needs a non-empty string {id_field!r}, got {call_id!r} in {item!r}; "
            "nothing was run",
            field=id_field,
        )
    if not isinstance(name, str):
        raise EffectLedgerValidationError(
            f"a {what} needs a string name, got {name!r} in {item!r}; nothing was run",
            field="name",
        )
    return ModelCall(call_id=call_id, name=name, arguments=arguments)


def _options_for(
    run_options: RunOptions | None, wait_for_approval: bool | None
) -> RunOptions | None:
    """The run options for every call: ``run_options``, with ``wait_for_approval`` over them."""
    if run_options is not None and not isinstance(run_options, RunOptions):
        raise EffectLedgerValidationError(
            f"run_options must be a RunOptions, got {run_options!r}", field="run_options"
        )
    if wait_for_approval is None:
        return run_options
    return merge_run_options(
        run_options or RunOptions(), RunOptions(wait_for_approval=wait_for_approval)
    )


async def dispatch(
    ledger: EffectLedger,
    calls: Iterable[ModelCall | None],
    answer: Callable[[Reply], _A],
    *,
    run_options: RunOptions | None,
    wait_for_approval: bool | None,
) -> list[_A]:
    """Run ``calls`` (None: not the ledger's, skipped) concurrently; their replies in
    order, each as ``answer`` spells it for the SDK, or the first exception to
    raise, after every call settled.

    The options every adapter's ``run_*`` function takes: ``wait_for_approval=False``
    raises ``ApprovalPendingError`` for a call that needs a person instead of waiting
    (``RunOptions(wait_for_approval=False)``); None leaves it to the tool's and the
    ledger's options. ``run_options`` go over each tool's own. A denied call (its
    handler does not run) raises ``EffectDeniedError``.
    """
    options = _options_for(run_options, wait_for_approval)
    ours = [call for call in calls if call is not None]
    if not ours:
        return []
    if len(ours) == 1:
        # No task for the common case: one call, awaited right here.
        return [answer(await _run_one(ledger, ours[0], options))]
    outcomes = await asyncio.gather(
        *(_run_one(ledger, call, options) for call in ours), return_exceptions=True
    )
    replies: list[Reply] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        replies.append(outcome)
    return [answer(reply) for reply in replies]


async def _run_one(ledger: EffectLedger, call: ModelCall, run_options: RunOptions | None) -> Reply:
    try:
        tool = find_model_tool(ledger, call.name)
        # Parsed here, so an error names the tool as the model knows it;
        # parse_arguments answers any other type of arguments as malformed.
        raw = cast("str | bytes | Mapping[str, Any] | None", call.arguments)
        arguments = parse_arguments(raw, call.name)
        key = _key_of(tool, arguments, call.name)
    except MalformedToolCall as exc:
        return _error(call, str(exc))
    try:
        value = await tool.invoke(arguments, call_id=call.call_id, run_options=run_options)
    except Exception as exc:
        if await is_tool_failure(ledger, key, exc):
            # The tool's own exception (a ledger error of a tool call inside it
            # included), recorded as this effect's failure: read back from the record.
            return _error(call, await _recorded_failure(ledger, key, call.name, exc))
        if isinstance(exc, EffectFailedError):
            # A replay of a recorded failure: read back as the first time was.
            return _error(call, _failure(call.name, exc.message, exc.code))
        if isinstance(exc, EffectPayloadMismatchError):
            return _error(call, str(exc))
        if isinstance(exc, EffectDeniedError) and not may_have_run(exc):
            # A person said no (or canceled it before it ran): this call's
            # answer, so one denial does not sink the turn's other calls.
            return _error(call, for_model(exc) or str(exc))
        if isinstance(exc, EffectLedgerValidationError) and exc.field == "result":
            # A result that is not JSON: recorded as the effect's failure
            # (result_not_serializable), so read back from the record.
            return _error(call, await _recorded_failure(ledger, key, call.name, exc))
        raise
    return Reply(call, value if isinstance(value, str) else _json(value))


def _key_of(tool: Tool[Any], arguments: dict[str, Any], name: str) -> str:
    """The key ``tool.invoke(arguments)`` will run under, worked out as the run does.

    Before anything is stored, arguments the model got wrong raise
    ``MalformedToolCall``: ones that do not bind, and ones the ledger cannot
    keep as they are (over ``max_args_size_bytes``, nested too deep,
    integers beyond 64 bits, NaN or Infinity, lone surrogates, keys that are
    not strings: an Anthropic ``input`` arrives decoded, with Python values).
    The engine refuses the same (``field="args"``), but raised out of
    ``invoke`` that could not be told from a tool call inside the tool.
    What the application must fix (a call outside a workflow) is raised.
    """
    try:
        return call_key(tool, arguments)
    except EffectLedgerValidationError as exc:
        if exc.field != "args":
            raise
        raise MalformedToolCall(
            f"the arguments for tool {name!r} were refused, nothing ran: {exc}", tool=name
        ) from None


async def _recorded_failure(ledger: EffectLedger, key: str, name: str, exc: Exception) -> str:
    """What the model reads for a run that failed with ``exc``: the recorded failure.

    Read from the store, so the first answer is a replay's, word for word,
    whatever the engine made of ``exc`` (``retries_exhausted`` after the last
    try of a retry policy, ``result_not_serializable``). If the record is not
    there (the effect was taken over or reopened meanwhile), the engine's
    rule for ``exc`` stands in.
    """
    failure = await recorded_failure(ledger, key)
    if failure is not None:
        return _failure(name, failure.message, failure.code)
    message, code = recorded(exc)
    return _failure(name, message, code)


def _json(value: object) -> str:
    # Sorted keys: a replay reads the stored copy, whose key order is the
    # store's (PostgreSQL's jsonb has its own); sorted, every reply reads the same.
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _error(call: ModelCall, message: str) -> Reply:
    return Reply(call, ERROR_PREFIX + message, is_error=True)


def _failure(name: str, message: str, code: str | None) -> str:
    return f"tool {name!r} failed ({code or 'error'}): {message}"


_P = ParamSpec("_P")
_R = TypeVar("_R")


def blocking(
    run: Callable[Concatenate[EffectLedger, _P], Awaitable[_R]],
) -> Callable[Concatenate[EffectLedger, _P], _R]:
    """The synchronous twin of an adapter's ``run_*`` coroutine function (``run_*_sync``).

    It runs ``run`` on the ledger's event loop (``EffectLedger.call_sync``: a
    background loop the ledger owns, see "Sync callers" in docs/tools.md), in
    the caller's context, so ``with ledger.workflow(...)`` applies, and blocks
    until every call settled; the calls still run concurrently there. Called
    on a running event loop it raises instead of blocking it.
    """

    def run_sync(ledger: EffectLedger, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return ledger.call_sync(run, ledger, *args, **kwargs)

    functools.update_wrapper(run_sync, run)  # its module, and its signature for inspect
    run_sync.__name__ = run_sync.__qualname__ = f"{run.__name__}_sync"
    run_sync.__doc__ = (
        f"``{run.__name__}`` for a synchronous agent loop: blocks until every call settled.\n\n"
        "Runs on the ledger's event loop (``EffectLedger.call_sync``), in the caller's\n"
        "context, so ``with ledger.workflow(...)`` applies. Called on a running event\n"
        f"loop it raises instead of blocking it: await ``{run.__name__}`` there.\n"
    )
    # ``ledger`` may be passed by name, as before these were generated; the
    # declared type (Concatenate) can only say "first positional".
    return cast("Callable[Concatenate[EffectLedger, _P], _R]", run_sync)
