"""LangChain: a ledger tool as a ``StructuredTool``, and a LangChain tool run through the ledger.

``as_langchain_tool(tool)`` gives a tool registered with ``@ledger.tool`` to
LangChain: its arguments schema comes from the function's signature (the
``effect`` parameter left out), and every run is one ``Tool.invoke``
(``ainvoke``) or ``Tool.invoke_sync`` (``invoke``, from sync code: the
ledger runs the call on its own event-loop thread). Invoked
with a ``ToolCall`` (what a model sends, an ``AIMessage.tool_calls`` entry),
the call's id is recorded as the effect's ``call_id`` (never part of the key)
and the result is a ``ToolMessage`` carrying that id, so five calls with five
ids get one execution and five messages.

``wrap_langchain_tool(ledger, base_tool, ...)`` does the reverse for a tool
you already have: it registers a ledger tool that runs the LangChain tool
(name, keys and approval policy as ``@ledger.tool`` takes them) and returns
the LangChain tool to give the model in its place.

Arguments LangChain validated into Python objects (an enum member, a
``date``, a pydantic model) are turned back into their JSON before the key
is made, and the tool receives that JSON, as from every adapter (see
``agent_ledger.adapters._signature``).

What reaches whom:

* Malformed arguments (that do not fit the schema or the signature, or
  that a key cannot hold: NaN nested in a dict, an integer beyond 64 bits,
  over ``max_args_size_bytes``) store nothing. Invoked with a ``ToolCall``,
  the result is a ``ToolMessage`` with ``status="error"`` telling the model
  what was wrong; invoked with plain arguments, ``MalformedToolCall`` is
  raised.
* A ``ToolException`` (LangChain's "the model should read this and may
  fix it") is recorded as a retryable failure: it is raised as a
  ``ToolException`` saying that calling again runs it again, and the next
  call with the same key does run again. Other exceptions stay final (a
  repeat raises ``EffectFailedError``).
* A result answered from an earlier turn's receipt (a tool whose scope
  lets a later turn reuse it) says so, with its time and receipt.
* Everything else the ledger decides reaches the application as the
  exception it is: ``EffectDeniedError``, ``ApprovalPendingError`` (with
  ``wait_for_approval=False``), ``EffectPayloadMismatchError``,
  ``BudgetExceededError``.

Inside a LangGraph graph a pending approval is an ``interrupt()`` and a
denial a ``ToolMessage`` for the model: see ``agent_ledger.adapters.langgraph``.
Parameters LangChain or LangGraph inject (``ToolRuntime``,
``InjectedState``, ``InjectedToolCallId``, ...) reach the function and are
never part of the key. ``record_model_calls`` records a chat model's calls.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, get_args, get_origin

import orjson

from agent_ledger.adapters._common import MalformedToolCall, missing_extra

try:
    from langchain_core.language_models import BaseChatModel, LanguageModelInput
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ToolMessage,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import Runnable
    from langchain_core.tools import (
        BaseTool,
        InjectedToolArg,
        StructuredTool,
        ToolException,
    )
    from langchain_core.tools import base as _lc_tools_base
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing_extra(__name__, "LangChain", "langchain", "(langchain-core)") from exc
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model
from pydantic_core import to_jsonable_python

from agent_ledger.adapters._messages import answer_failure, earlier_turn_text, retryable_text
from agent_ledger.adapters._outcome import is_tool_failure, recorded_failure
from agent_ledger.adapters._signature import (
    REQUIRED,
    Argument,
    JsonArguments,
    arguments,
    check_storable,
    description,
    dressed,
    name_for,
    refuse_factories,
    refuse_names,
)
from agent_ledger.context import adapter_run, current_turn, enter_adapter_run, exit_adapter_run
from agent_ledger.effects import Usage
from agent_ledger.errors import EffectFailedError, EffectLedgerValidationError
from agent_ledger.options import UNSET, RunOptions, merge_run_options
from agent_ledger.retries import failure_is_retryable
from agent_ledger.tools import CallOutcome, LLMResult, Pricing, Tool, current_workflow

if TYPE_CHECKING:
    from agent_ledger.adapters.langgraph import GraphCall
    from agent_ledger.calls import Scope, ToolCall
    from agent_ledger.calls import ToolCall as LedgerCall
    from agent_ledger.ledger import EffectLedger

__all__ = [
    "RUNTIME_FIELD",
    "LedgerChatModel",
    "LedgerTool",
    "as_langchain_tool",
    "record_model_calls",
    "wrap_langchain_tool",
]

#: Parameter names LangChain fills itself, dropping what the model sent.
_LANGCHAIN_NAMES: Final = dict.fromkeys(
    ("config", "run_manager"),
    "LangChain passes its own value under that name and drops the model's",
)

#: The hidden field through which LangGraph's ``ToolNode`` hands a ledger tool
#: its ``ToolRuntime`` (never shown to the model, never passed to the function).
RUNTIME_FIELD: Final = "agent_ledger_runtime"

#: What model providers accept in a function name (OpenAI's rule; Anthropic's is the same set).


@dataclass(slots=True)
class _Run:
    """One LangChain run of a ledger tool, as the tool's function sees it."""

    #: The ToolCall's id, when LangChain was given a ToolCall.
    call_id: str | None
    #: Set when LangChain has validated the input and called the tool's function.
    started: bool = False


def _current_run() -> _Run | None:
    """The LangChain run of a ledger tool this code is in, if any.

    LangChain hands the tool-call id to ``BaseTool.run``/``arun`` but not to
    the function they call; ``LedgerTool`` keeps its ``_Run`` in the context
    (``agent_ledger.context.adapter_run``) for the duration of the run. A run
    copies the context before calling the function, so the value reaches it,
    and nested runs of other tools set their own.
    """
    run = adapter_run()
    return run if isinstance(run, _Run) else None


class LedgerTool(StructuredTool):
    """A ``StructuredTool`` whose every run is one run of a ledger tool (``ledger_tool``).

    Made by ``as_langchain_tool`` and ``wrap_langchain_tool``. It behaves as
    any ``StructuredTool`` (``invoke``, ``ainvoke``, ``bind_tools``, agents)
    and adds what the ledger needs: the ``ToolCall``'s id, and malformed
    arguments answered without running anything (see the module doc).
    """

    _ledger_tool: Tool[Any] = PrivateAttr()

    @property
    def ledger_tool(self) -> Tool[Any]:
        """The ledger tool this LangChain tool runs."""
        return self._ledger_tool

    def run(
        self,
        tool_input: str | dict[str, Any],
        *args: Any,
        tool_call_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        with self._answering(tool_call_id) as malformed:
            return super().run(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        return malformed[0]

    async def arun(
        self,
        tool_input: str | dict[str, Any],
        *args: Any,
        tool_call_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        with self._answering(tool_call_id) as malformed:
            return await super().arun(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        return malformed[0]

    @contextmanager
    def _answering(self, tool_call_id: str | None) -> Iterator[list[ToolMessage]]:
        """One run (``run`` or ``arun``): its tool-call id reaches the function, and
        input LangChain refused before calling it is answered, not raised: the
        answer is put in the yielded list, and the ``ValidationError`` ends there."""
        run = _Run(tool_call_id)
        token = enter_adapter_run(run)
        malformed: list[ToolMessage] = []
        try:
            yield malformed
        except ValidationError as exc:
            if run.started:
                raise  # the tool's own exception, not its input's
            malformed.append(self._malformed(_describe(self.name, exc), tool_call_id, exc))
        finally:
            exit_adapter_run(token)

    def _malformed(
        self, message: str, tool_call_id: str | None, cause: Exception | None
    ) -> ToolMessage:
        """The model's answer to arguments that cannot run: an error ``ToolMessage``.

        Without a tool-call id there is no model to answer, only code that
        called the tool: it gets ``MalformedToolCall``.
        """
        if tool_call_id is None:
            raise MalformedToolCall(message, tool=self._ledger_tool.name) from cause
        return ToolMessage(message, tool_call_id=tool_call_id, name=self.name, status="error")


def as_langchain_tool(
    tool: Tool[Any],
    *,
    name: str | None = None,
    description: str | None = None,
    wait_for_approval: bool = True,
) -> LedgerTool:
    """A LangChain ``StructuredTool`` that runs ``tool`` through its ledger.

    ``name`` defaults to the ledger tool's name with every character a model
    provider refuses in a function name (``.``, spaces, ...) replaced by
    ``_`` (``payments.charge`` becomes ``payments_charge``); the ledger name,
    which is in every key, is unchanged. ``description`` defaults to the
    function's docstring. The arguments schema is built from the signature
    (``effect`` left out), refuses arguments the function does not take, and
    NaN/Infinity, which JSON keys cannot hold. The function receives its
    arguments as JSON: an enum's value, a date as ISO text, a model as a
    dict (the key is made of them, so it is the key a direct call with the
    same JSON makes).

    ``wait_for_approval=False`` makes a call that needs a person's approval
    raise ``ApprovalPendingError`` at once instead of waiting
    (``RunOptions(wait_for_approval=False)``). The workflow is the tool's own
    (``@ledger.tool(workflow_id=...)``) or the ``ledger.workflow(...)``
    around the call.
    """
    if not isinstance(tool, Tool):
        raise EffectLedgerValidationError(
            f"as_langchain_tool takes a ledger tool (from @ledger.tool), got {tool!r}",
            field="tool",
        )
    refuse_names(tool, "LangChain", _LANGCHAIN_NAMES)
    lc_name = _langchain_name(tool.name) if name is None else name
    args = arguments(tool)
    injected = frozenset(arg.name for arg in args if _is_injected(arg.annotation))
    _refuse_injected_keys(tool, injected)
    schema = _arguments_model(tool, lc_name, args)
    refuse_factories(schema, f"tool {tool.name!r}", "LangChain", "fn")
    to_json = JsonArguments(
        tool.name, {arg.name: arg.annotation for arg in args if arg.name not in injected}
    )
    return _build(
        tool,
        name=lc_name,
        description=_description(tool) if description is None else description,
        args_schema=schema,
        wait_for_approval=wait_for_approval,
        to_json=to_json,
        injected=injected,
    )


def wrap_langchain_tool(
    ledger: EffectLedger,
    base_tool: BaseTool,
    name: str | None = None,
    *,
    idempotency_keys: Sequence[str] | None = None,
    validate_keys: Sequence[str] | Literal["all"] | None = None,
    requires_approval: bool | Callable[[ToolCall], bool] | None = None,
    workflow_id: str | None = None,
    run_options: RunOptions | None = None,
    wait_for_approval: bool = True,
) -> LedgerTool:
    """Register ``base_tool`` on ``ledger`` as a tool, and return the LangChain tool that runs it.

    The ledger tool is named ``name`` (default: ``base_tool.name``; it is in
    every key, so keep it stable) and registered in ``ledger.tools``; the
    other keyword arguments are ``@ledger.tool``'s. Its arguments are the
    ones ``base_tool`` shows a model (its ``tool_call_schema``), defaults
    filled in, and each call runs ``base_tool.ainvoke(arguments)`` once per
    key. Give the model the returned tool instead of ``base_tool``: it has
    the same name, description and schema.

    Refused (``EffectLedgerValidationError``): ``response_format=
    "content_and_artifact"`` (the ledger keeps one JSON result per call),
    arguments LangChain injects at run time (``InjectedToolArg``), which are
    not the model's and cannot be part of a key, and arguments with a
    ``default_factory``, which LangChain fills with a new value on every run
    before the key is made (every repeat would run again). The result must be JSON,
    as for any ledger tool; a tool whose ``handle_tool_error`` turns an error
    into text returns that text, and the ledger records it as the result.
    """
    if not isinstance(base_tool, BaseTool):
        raise EffectLedgerValidationError(
            f"wrap_langchain_tool takes a LangChain BaseTool, got {base_tool!r}", field="base_tool"
        )
    if base_tool.response_format != "content":
        raise EffectLedgerValidationError(
            f"LangChain tool {base_tool.name!r} has response_format="
            f"{base_tool.response_format!r}; only 'content' can be wrapped, since the ledger "
            "keeps one JSON result per call",
            field="base_tool",
        )
    schema = _model_schema(base_tool)
    to_json: Callable[[Mapping[str, Any], str], dict[str, Any]]
    if isinstance(schema, dict):
        # LangChain does not validate against a JSON schema: the values are the model's JSON.
        to_json = _as_sent
    else:
        refuse_factories(schema, f"LangChain tool {base_tool.name!r}", "LangChain", "base_tool")
        to_json = JsonArguments(
            base_tool.name,
            {
                name: Annotated[(field.annotation, *field.metadata)]
                if field.metadata
                else field.annotation
                for name, field in schema.model_fields.items()
            },
        )
    fn = _function_running(base_tool, *_parameters(base_tool, schema))
    tool: Tool[Any] = ledger.tool(
        base_tool.name if name is None else name,
        idempotency_keys=idempotency_keys,
        validate_keys=validate_keys,
        requires_approval=requires_approval,
        workflow_id=workflow_id,
        run_options=run_options,
    )(fn)
    return _build(
        tool,
        name=base_tool.name,
        description=base_tool.description,
        args_schema=schema,
        wait_for_approval=wait_for_approval,
        to_json=to_json,
        return_direct=base_tool.return_direct,
        tags=base_tool.tags,
        metadata=base_tool.metadata,
    )


# -- building --------------------------------------------------------------------------


def _build(
    tool: Tool[Any],
    *,
    name: str,
    description: str,
    args_schema: type[BaseModel] | dict[str, Any],
    wait_for_approval: bool,
    to_json: Callable[[Mapping[str, Any], str], dict[str, Any]],
    injected: frozenset[str] = frozenset(),
    **fields: Any,
) -> LedgerTool:
    """The ``LedgerTool`` whose function and coroutine run ``tool``.

    ``to_json`` turns the arguments LangChain validated (enum members,
    dates, models) back into the JSON values the key is made of, which are
    also what the tool receives (a wrapped LangChain tool validates them
    again itself). ``injected`` names the parameters LangChain or LangGraph
    fill in (``ToolRuntime``, ``InjectedState``, ...): passed to the
    function as they come, never part of the key.
    """
    options = None if wait_for_approval else RunOptions(wait_for_approval=False)

    def started(kwargs: dict[str, Any]) -> _Call | ToolMessage:
        run = _current_run()
        call_id = None
        if run is not None:
            run.started = True
            call_id = run.call_id
        runtime = kwargs.pop(RUNTIME_FIELD, None)
        passed = {n: kwargs.pop(n) for n in injected if n in kwargs}
        try:
            values = tool.bind_arguments({**to_json(kwargs, tool.name), **passed})
            passed = {n: values.pop(n) for n in injected if n in values}
            # Values the schema let through but a key cannot hold (NaN inside
            # a dict, an integer beyond 64 bits, a payload over the size limit).
            check_storable(tool, values)
        except EffectLedgerValidationError as exc:
            # A JSON-schema tool's input is not validated by LangChain: this
            # is the first check, and the model's mistake.
            return lc_tool._malformed(str(exc), call_id, None)
        if runtime is None:
            runtime = next((v for v in passed.values() if _is_runtime(type(v))), None)
        return _Call(tool, values, passed, call_id, runtime)

    async def coroutine(**kwargs: Any) -> Any:
        call = started(kwargs)
        if isinstance(call, ToolMessage):
            return call
        graph = _graph(call)
        if graph is not None:
            return await graph.arun(call.answered)
        return await call.answered(options)

    def func(**kwargs: Any) -> Any:
        # Sync invoke: the ledger runs the call on its own event loop thread
        # (Tool.invoke_sync), in this context, so the workflow scope applies.
        call = started(kwargs)
        if isinstance(call, ToolMessage):
            return call
        graph = _graph(call)
        if graph is not None:
            return graph.run_sync(call.answered_sync)
        return call.answered_sync(options)

    lc_tool = LedgerTool(
        name=name,
        description=description,
        args_schema=args_schema,
        func=func,
        coroutine=coroutine,
        **fields,
    )
    lc_tool._ledger_tool = tool
    return lc_tool


@dataclass(frozen=True, slots=True)
class _Call:
    """One call of a ledger tool as LangChain made it, ready to run through the ledger."""

    tool: Tool[Any]
    #: The model's arguments, bound and as JSON: what the key is made of.
    values: dict[str, object]
    #: The values LangChain or LangGraph injected (by parameter name): passed
    #: to the function, never part of the key or the stored args.
    injected: dict[str, object]
    #: The framework's tool-call id, when LangChain was given a ToolCall.
    call_id: str | None
    #: LangGraph's ``ToolRuntime`` when a ``ToolNode`` runs the call, else None.
    runtime: object | None

    def default_scope(self) -> Scope | None:
        """The adapter's scope: ``"turn"`` where the call has a turn (a LangGraph
        run's human message, or ``ledger.workflow(id, turn=...)``), else the
        tool's own or ``"workflow"``. A tool's ``scope=`` always wins."""
        tool = self.tool
        return "turn" if current_turn(tool.workflow_id or current_workflow()) else None

    def ledger_call(self) -> LedgerCall:
        """The ledger's ``ToolCall`` this call runs as, here (in the current workflow)."""
        return self.tool.call_of(self.values, self.call_id, None, self.default_scope())

    def key(self) -> str | None:
        """The idempotency key this call runs under here; None if no key can be made."""
        try:
            return self.tool.ledger.idem_key(self.ledger_call())
        except EffectLedgerValidationError:
            return None

    def options(self, options: RunOptions | None) -> RunOptions:
        """``options`` plus LangChain's retry signal: a ``ToolException`` (or what the
        tool declared retryable) is recorded as a failure a later call runs again."""
        own = self.tool.run_settings[0]
        spec = None if own is None or own.retryable is UNSET else own.retryable

        def retryable(error: BaseException) -> bool:
            return isinstance(error, ToolException) or failure_is_retryable(error, spec)

        return merge_run_options(options or RunOptions(), RunOptions(retryable=retryable))

    async def outcome(self, options: RunOptions | None) -> CallOutcome[object]:
        """One run of the call through the ledger, as a ``CallOutcome`` (the tool's
        failure in it; anything else raised as ``Tool.invoke`` raises it)."""
        tool, run_options = self.tool, self.options(options)
        if not self.injected:
            return await tool.call_outcome(
                self.values,
                call_id=self.call_id,
                run_options=run_options,
                default_scope=self.default_scope(),
            )
        # Values were injected: run_as passes them to the function without
        # making them part of the key. Whether the receipt is an earlier
        # turn's is read from it, as call_outcome does.
        call = self.ledger_call()
        key = tool.ledger.idem_key(call)
        result: object = None
        error: BaseException | None = None
        try:
            result = await tool.run_as(
                call, {**self.values, **self.injected}, run_options=run_options
            )
        except Exception as exc:
            if not await is_tool_failure(tool.ledger, key, exc) and not (
                isinstance(exc, EffectFailedError) and exc.effect.idem_key == key
            ):
                raise
            error = exc
        effect = await tool.ledger.find_by_idem_key(key)
        effect_turn = None if effect is None else effect.turn
        return CallOutcome(
            result=result,
            replayed=False,
            from_earlier_turn=call.turn is not None and effect_turn != call.turn,
            completed_at=None if effect is None else effect.completed_at,
            idem_key=key,
            effect_turn=effect_turn,
            turn=call.turn,
            error=error,
            retryable=effect is not None and effect.retryable,
            effect=effect,
        )

    async def answered(self, options: RunOptions | None) -> object:
        """The call's result as the model should read it; a failure raised as a
        model reads it every time (``_answer``).

        A result from an earlier turn's receipt says so (``earlier_turn_text``).
        A retryable failure (a ``ToolException``) is raised as a
        ``ToolException`` saying that calling again runs it again.
        """
        try:
            outcome = await self.outcome(options)
        except Exception as exc:
            answer = await _answer(self, exc)
            if answer is exc:
                raise
            raise answer from exc
        error = outcome.error
        if error is None:
            if outcome.from_earlier_turn:
                return earlier_turn_text(outcome, _as_text(outcome.result))
            return outcome.result
        if outcome.retryable:
            raise ToolException(retryable_text(error, outcome.idem_key)) from error
        if not isinstance(error, Exception):
            raise error
        answer = await _answer(self, error)
        raise answer from (None if answer is error else error)

    def answered_sync(self, options: RunOptions | None) -> object:
        """``answered`` from sync code: on the ledger's event-loop thread, in this
        context, so the workflow scope around it applies (``Tool.invoke_sync``)."""
        return self.tool.ledger.call_sync(self.answered, options)


def _as_text(result: object) -> str:
    """A result as LangChain shows it to a model: text as it is, anything else as JSON."""
    if isinstance(result, str):
        return result
    try:
        return orjson.dumps(result).decode()
    except TypeError:
        return str(result)


def _graph(call: _Call) -> GraphCall | None:
    """The LangGraph run ``call`` is made in, if any (see ``agent_ledger.adapters.langgraph``).

    LangGraph is imported only when it already is: a program that never
    loaded it runs no graph.
    """
    if "langgraph" not in sys.modules:
        return None
    from agent_ledger.adapters.langgraph import graph_call

    return graph_call(call)


async def _answer(call: _Call, error: Exception) -> Exception:
    """What to raise for a run that raised ``error``, so a model reads the same every time.

    A failure first raised as ``ToolException`` (the tool's own, a replay of
    it, or a ledger error of a tool call inside the tool that was one) is
    raised as ``ToolException`` with the recorded message, on the first call
    and on every replay, so ``handle_tool_error`` treats them alike; see
    ``answer_failure``. Anything else is raised as it is.
    """
    tool = call.tool
    key = call.key()
    if await is_tool_failure(tool.ledger, key, error):
        failure = None if key is None else await recorded_failure(tool.ledger, key)
        return answer_failure(failure, error, ToolException, ToolException)
    if isinstance(error, EffectFailedError):  # a replay of this call's failure
        return answer_failure(error, error, ToolException, ToolException)
    return error


def _langchain_name(ledger_name: str) -> str:
    return name_for(ledger_name)


def _description(tool: Tool[Any]) -> str:
    return description(tool) or f"Runs {tool.name} (recorded by agent-ledger)."


def _arguments_model(tool: Tool[Any], model_name: str, args: list[Argument]) -> type[BaseModel]:
    """The pydantic model of a ledger tool's arguments, from its signature.

    Injected parameters keep their annotations, by which LangChain leaves
    them out of what the model sees and LangGraph's ``ToolNode`` fills
    them. Where LangGraph is installed, a tool without a ``ToolRuntime``
    parameter gets a hidden one (``RUNTIME_FIELD``, never passed to the
    function): a ``ToolNode`` fills it, and the adapter reads the thread and
    the turn from it (see ``agent_ledger.adapters.langgraph``).
    """
    fields: dict[str, Any] = {
        arg.name: (arg.annotation, ... if arg.default is REQUIRED else arg.default) for arg in args
    }
    if not any(_is_runtime(arg.annotation) for arg in args):
        hidden = _runtime_annotation()
        if hidden is not None:
            fields[RUNTIME_FIELD] = (hidden, None)
    # extra="forbid": a misspelt argument must not quietly run the tool with a
    # default. allow_inf_nan=False: JSON (and so a key) cannot hold them.
    config = ConfigDict(extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
    model: type[BaseModel] = create_model(model_name, __config__=config, **fields)
    return model


def _is_runtime(annotation: Any) -> bool:
    """Whether ``annotation`` is a value LangChain passes whole (LangGraph's ``ToolRuntime``)."""
    direct = getattr(_lc_tools_base, "_DirectlyInjectedToolArg", None)
    if direct is None:  # langchain-core before 1.0: no such arguments
        return False
    origin = get_origin(annotation)
    return any(
        isinstance(candidate, type) and issubclass(candidate, direct)
        for candidate in (annotation, origin)
    )


def _is_injected(annotation: Any) -> bool:
    """Whether a parameter annotated ``annotation`` is filled by LangChain or LangGraph,
    never sent by the model: ``ToolRuntime``, or ``Annotated[..., InjectedToolArg]``
    (``InjectedToolCallId``, ``InjectedState``, ``InjectedStore``, ...)."""
    if _is_runtime(annotation):
        return True
    if get_origin(annotation) is not Annotated:
        return False
    return any(
        isinstance(meta, InjectedToolArg)
        or (isinstance(meta, type) and issubclass(meta, InjectedToolArg))
        for meta in get_args(annotation)[1:]
    )


def _refuse_injected_keys(tool: Tool[Any], injected: frozenset[str]) -> None:
    """A value LangChain injects is never the model's, and not JSON: it cannot be a key."""
    named = [
        name
        for names in (tool.idempotency_keys, tool.validate_keys)
        if names is not None and names != "all"
        for name in names
        if name in injected
    ]
    if named:
        raise EffectLedgerValidationError(
            f"tool {tool.name!r}: {sorted(set(named))} are filled in by LangChain or LangGraph "
            "(injected), not sent by the model, so they cannot be part of the key; leave them "
            "out of idempotency_keys and validate_keys",
            field="idempotency_keys",
        )


def _runtime_annotation() -> Any:
    """The hidden ``ToolRuntime`` field's annotation, or None without LangGraph."""
    if importlib.util.find_spec("langgraph") is None:
        return None
    try:
        from agent_ledger.adapters.langgraph import RUNTIME_ANNOTATION
    except ImportError:  # langgraph without its prebuilt ToolNode
        return None
    return RUNTIME_ANNOTATION


def _as_sent(values: Mapping[str, Any], tool_name: str) -> dict[str, Any]:
    return dict(values)


def _model_schema(base_tool: BaseTool) -> type[BaseModel] | dict[str, Any]:
    """What ``base_tool`` shows a model: a pydantic (v2) model or a JSON schema."""
    schema = base_tool.tool_call_schema
    if isinstance(schema, dict) or (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return schema
    raise EffectLedgerValidationError(
        f"LangChain tool {base_tool.name!r} describes its arguments with a pydantic v1 "
        "model; wrap tools whose args_schema is a pydantic v2 model or a JSON schema",
        field="base_tool",
    )


def _parameters(
    base_tool: BaseTool, schema: type[BaseModel] | dict[str, Any]
) -> tuple[list[inspect.Parameter], frozenset[str]]:
    """The named parameters a wrapped LangChain tool takes, from what it shows a model,
    and the optional ones without a default (a JSON schema may leave it to the tool).

    Those get ``None`` in the ledger's signature, which has a default for every
    optional parameter, and are left out of the tool's input when ``None``, so
    the tool applies its own default.
    """
    kind = inspect.Parameter.KEYWORD_ONLY
    if isinstance(schema, dict):
        required = set(schema.get("required", ()))
        properties: dict[str, Any] = schema.get("properties", {})
        return [
            inspect.Parameter(
                name, kind, default=REQUIRED if name in required else prop.get("default")
            )
            for name, prop in properties.items()
        ], frozenset(n for n, p in properties.items() if n not in required and "default" not in p)
    full = base_tool.args_schema
    full_fields = (
        full.model_fields if isinstance(full, type) and issubclass(full, BaseModel) else {}
    )
    injected = sorted(set(full_fields) - set(schema.model_fields))
    if injected:
        raise EffectLedgerValidationError(
            f"LangChain tool {base_tool.name!r} has arguments injected at run time "
            f"({injected}); they are not the model's and cannot be part of a key, so "
            "the tool cannot be wrapped. Wrap a tool that takes only the model's arguments.",
            field="base_tool",
        )
    return [
        inspect.Parameter(
            name,
            kind,
            default=(REQUIRED if field.is_required() else to_jsonable_python(field.get_default())),
        )
        for name, field in schema.model_fields.items()
    ], frozenset()


def _function_running(
    base_tool: BaseTool, parameters: list[inspect.Parameter], unset: frozenset[str]
) -> Callable[..., Any]:
    """The function the ledger tool wraps: runs ``base_tool`` with the call's arguments."""

    async def run_langchain_tool(**arguments: Any) -> Any:
        sent = {k: v for k, v in arguments.items() if not (v is None and k in unset)}
        return await base_tool.ainvoke(sent)

    return dressed(
        run_langchain_tool, base_tool.name, base_tool.description, inspect.Signature(parameters)
    )


def _describe(tool_name: str, error: ValidationError) -> str:
    """A pydantic error as a model reads it: each field and what was wrong, no echoed values."""
    problems = "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'arguments'}: {item['msg']}"
        for item in error.errors(include_url=False, include_input=False)
    )
    return (
        f"The arguments for tool {tool_name!r} do not fit its schema ({problems}). Nothing "
        "ran and nothing was stored; call the tool again with arguments that fit it."
    )


# -- model calls ----------------------------------------------------------------------


class LedgerChatModel(BaseChatModel):
    """A LangChain chat model whose every call is one ``ledger.llm()`` effect.

    Made by ``record_model_calls(ledger, model, ...)``; give it to an agent
    (``create_agent``, ``create_react_agent``, ``model.bind_tools(...)``) in
    place of ``model``. Each call is keyed by the workflow, provider, model
    name and request (the messages without their ids, which LangGraph makes
    up anew on every run, the bound tools and the call's options), and
    recorded with the reply and its usage, priced by ``pricing``. So under
    ``ledger.workflow(id, budget=Budget(usd=...))`` a call that does not fit
    raises ``BudgetExceededError`` before the model is called; a repeated
    call (a resumed thread, a restarted process) and ``ledger.replay(...)``
    get the recorded reply without calling it. Inside a graph with no
    workflow around it, the thread is the workflow, as for tools.
    """

    #: The wrapped model, as the agent uses it (with its tools bound, once bound).
    inner: Runnable[LanguageModelInput, BaseMessage]
    #: The wrapped model before any binding, to bind tools to.
    base: Runnable[LanguageModelInput, BaseMessage]
    ledger: Any
    provider: str
    model_name: str
    pricing: Any = None
    estimate: Any = None
    #: The bound tools as the model sees them (OpenAI's tool format): part of the key.
    tool_schemas: list[dict[str, Any]] = Field(default_factory=list)
    #: The options the tools were bound with (``tool_choice``, ...): part of the key.
    bind_options: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @property
    def _llm_type(self) -> str:
        return "agent-ledger"

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> LedgerChatModel:
        """The same recorded model with ``tools`` bound to the wrapped one."""
        bind = getattr(self.base, "bind_tools", None)
        if bind is None:
            raise EffectLedgerValidationError(
                f"the wrapped model {self.base!r} cannot bind tools", field="model"
            )
        options = dict(kwargs)
        if tool_choice is not None:
            options["tool_choice"] = tool_choice
        return self.model_copy(
            update={
                "inner": bind(tools, **options),
                "tool_schemas": [convert_to_openai_tool(t) for t in tools],
                "bind_options": to_jsonable_python(options, fallback=repr),
            }
        )

    def _request(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """The call's request as JSON, which its key is made of."""
        sent = []
        for message in messages:
            as_dict = message_to_dict(message)
            data = {k: v for k, v in as_dict["data"].items() if k != "id"}
            sent.append({"type": as_dict["type"], "data": data})
        request: dict[str, Any] = {
            "messages": to_jsonable_python(sent, fallback=repr),
            "tools": self.tool_schemas,
        }
        options = {**self.bind_options, **to_jsonable_python(kwargs, fallback=repr)}
        if stop is not None:
            options["stop"] = list(stop)
        if options:
            request["options"] = options
        return request

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        async def call_model(request: object) -> LLMResult:
            reply = await self.inner.ainvoke(messages, stop=stop, **kwargs)
            return LLMResult(response=message_to_dict(reply), usage=_usage(reply))

        reply = await self.ledger.llm(
            call_model,
            provider=self.provider,
            model=self.model_name,
            request=self._request(messages, stop, kwargs),
            pricing=self.pricing,
            estimate=self.estimate,
            workflow_id=None if current_workflow() is not None else _thread_id(),
        )
        (message,) = messages_from_dict([reply.response])
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        # On the ledger's own event loop, in this context (a workflow around
        # the call applies): the same path as an async call.
        result: ChatResult = self.ledger.call_sync(self._agenerate, messages, stop, None, **kwargs)
        return result


def record_model_calls(
    ledger: EffectLedger,
    model: BaseChatModel,
    *,
    provider: str = "langchain",
    model_name: str | None = None,
    pricing: Pricing | None = None,
    estimate: Usage | None = None,
) -> LedgerChatModel:
    """``model``, with every call recorded through ``ledger.llm()`` (see ``LedgerChatModel``).

    ``provider`` and ``model_name`` name the calls on their receipts and in
    their keys (``model_name`` defaults to the model's ``model_name`` or
    ``model`` attribute, else its type); ``pricing(provider, model_name,
    usage)`` prices each reply's tokens (needed by a dollar budget), and
    ``estimate`` is the usage a budget reserves before each call.
    """
    if not isinstance(model, BaseChatModel):
        raise EffectLedgerValidationError(
            f"record_model_calls takes a LangChain chat model, got {model!r}", field="model"
        )
    name = model_name
    if name is None:
        found = getattr(model, "model_name", None) or getattr(model, "model", None)
        name = found if isinstance(found, str) and found else type(model).__name__
    return LedgerChatModel(
        inner=model,
        base=model,
        ledger=ledger,
        provider=provider,
        model_name=name,
        pricing=pricing,
        estimate=estimate,
    )


def _usage(reply: BaseMessage) -> Usage:
    """The tokens a reply says it used (``usage_metadata``); none if it does not say."""
    usage = reply.usage_metadata if isinstance(reply, AIMessage) else None
    if not usage:
        return Usage()
    return Usage(input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"])


def _thread_id() -> str | None:
    """The thread of the graph this code runs in, if any (the workflow by default)."""
    if "langgraph" not in sys.modules:
        return None
    from agent_ledger.adapters.langgraph import current_thread

    return current_thread()
