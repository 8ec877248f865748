"""OpenAI Agents SDK: ledger tools as ``FunctionTool``s, approvals as the SDK's interruptions.

``as_function_tool(tool)`` gives the SDK a ``FunctionTool`` for a tool
registered with ``@ledger.tool``: its JSON schema comes from the tool's
signature (``effect`` left out) through the SDK's own schema builder, and
each invocation is one ``Tool.invoke`` with the SDK's tool-call id recorded
as the effect's ``call_id`` (never part of the key). ``as_function_tools``
converts all of a ledger's tools, or the ones named.

Approvals. The ledger decides who must approve and keeps the decision; the
SDK's human-in-the-loop flow is how a run pauses for it:

* a call whose effect waits for a person (or, for a new call, whose tool's
  ledger policy says it must) is an SDK interruption, and the adapter has
  already created the effect, waiting (``requires_approval``), so it shows
  in ``ledger.pending_approvals()`` and the CLI;
* ``approve(state, item, by=...)`` and ``reject(state, item, by=...)``
  record the decision on the ledger, then mark the run state; ``sync_decisions(state)``
  copies decisions made elsewhere (the CLI, another service) into it;
* a call the SDK paused on arguments it could not parse (it does so,
  without asking the adapter, for a tool with an approval policy) has no
  effect and never will: ``sync_decisions`` and ``reject`` reject it in the
  run state with what is wrong, which the model reads on resuming;
* the SDK's own ``state.approve(item)`` / ``state.reject(item)`` decide on
  the ledger too, as ``decided_by`` (default ``RUN_STATE``): an approved
  call's effect is approved when the run resumes and runs once; a rejected
  one (the SDK answers it without invoking the tool) is denied before the
  next model turn, when the SDK asks the tool whether it is enabled.

What the model sees (the invocation's result, as the SDK sends it on):

* the tool's value: a string as it is, anything else as canonical JSON text,
  so a replay reads exactly like the first run;
* arguments that are not JSON, miss or add parameters, have the wrong
  types or hold what the ledger cannot key exactly (an integer beyond 64
  bits, a number beyond a float): what is wrong (``MalformedToolCall``),
  with or without an approval policy; nothing is stored, nothing pauses;
* a denied or canceled effect: that a person denied it, and why; it never runs;
* the tool's own failure (its exception, a replayed failure):
  ``failure_error_function`` if the application gave one (``None`` raises
  instead); with the SDK's default, a retryable failure reads that it may
  be retried, a final one that it failed and that sending it again gives
  the same answer;
* a budget refusal, a replay off its recording and a call canceled while
  it ran raise out of ``Runner.run`` as the ledger's exceptions themselves
  (``tell_model=True``: the model reads them instead);
* everything that is the application's to fix (no workflow around the run,
  a store that is down, a result that is not JSON) raises: the run stops.

Scope: ``"turn"`` by default, the turn being the user request the run
answers (a digest of ``turn_input`` up to the user message that started it;
the same request sent again after a run that died unfinished continues its
turn: see ``run_turn``), unless the application gives one with
``ledger.workflow(id, turn=...)``. ``LedgerModel`` records the model's calls.

The workflow a call belongs to is the ``ledger.workflow(...)`` around
``Runner.run`` (tasks the SDK starts inherit it) or the tool's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias, cast

from agent_ledger.adapters._common import MalformedToolCall, missing_extra, parse_arguments

try:
    from agents import (
        AgentsException,
        FunctionTool,
        ItemHelpers,
        Model,
        ModelProvider,
        ModelResponse,
        ModelSettings,
        ModelTracing,
        RunContextWrapper,
        RunState,
        ToolApprovalItem,
        default_tool_error_function,
    )
    from agents import Usage as SdkUsage
    from agents.agent import AgentBase
    from agents.agent_output import AgentOutputSchemaBase
    from agents.function_schema import function_schema
    from agents.handoffs import Handoff
    from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
    from agents.tool import Tool as AgentTool
    from agents.tool_context import ToolContext
    from pydantic import BaseModel, TypeAdapter, ValidationError
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise missing_extra(__name__, "the OpenAI Agents SDK", "agents") from exc

import orjson

from agent_ledger.adapters._messages import (
    budget_text,
    earlier_run_text,
    failure_text,
    for_model,
    may_have_run,
    outcome_text,
    retryable_text,
)
from agent_ledger.adapters._outcome import recorded_failure
from agent_ledger.adapters._schema import chosen_tools
from agent_ledger.adapters._signature import arguments, description, refuse_names
from agent_ledger.calls import check_scope
from agent_ledger.context import current_turn, current_workflow
from agent_ledger.effects import JSONValue
from agent_ledger.effects import Usage as LedgerUsage
from agent_ledger.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    EffectDeniedError,
    EffectFailedError,
    EffectInFlightError,
    EffectLedgerInvariantError,
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    EffectStoreError,
    UnrecordedEffectError,
)
from agent_ledger.keys import canonical_json
from agent_ledger.options import RunOptions
from agent_ledger.status import EffectStatus
from agent_ledger.tools import EFFECT_PARAMETER, CallOutcome, LLMResult, Tool
from agent_ledger.tools._llm import Pricing
from agent_ledger.tools._workflow import WorkflowScope

if TYPE_CHECKING:
    from agent_ledger.calls import Scope, ToolCall
    from agent_ledger.effects import Effect
    from agent_ledger.ledger import EffectLedger

__all__ = [
    "RUN_STATE",
    "DecidedBy",
    "ErrorFunction",
    "LedgerFunctionTool",
    "LedgerModel",
    "LedgerModelProvider",
    "approve",
    "as_function_tool",
    "as_function_tools",
    "reject",
    "run_turn",
    "sync_decisions",
]

#: What turns a tool's own failure into the text the model reads: the SDK's
#: ``failure_error_function`` (sync or async).
ErrorFunction: TypeAlias = Callable[[RunContextWrapper[Any], Exception], str | Awaitable[str]]

#: Who decided, for a decision made in the SDK's run state (``state.approve(item)``,
#: ``state.reject(item)``): a name, or a function of the run context (your
#: context object may know the person).
DecidedBy: TypeAlias = str | Callable[[RunContextWrapper[Any]], str]

#: ``decided_by`` when the application names nobody: the SDK does not say who
#: called ``state.approve``/``state.reject``, so the receipt says where it was decided.
RUN_STATE: Final = "openai-agents run state"

#: An invocation never blocks on a person: the SDK pauses the run instead.
_NO_WAIT: Final = RunOptions(wait_for_approval=False)
#: Records a call the SDK is about to pause for: created waiting for a person,
#: not run. Forced, so the ledger holds exactly what the SDK was told.
_PARK: Final = RunOptions(requires_approval=True, wait_for_approval=False)
#: What the OpenAI API accepts as a function name.
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_IN_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")


@dataclass
class LedgerFunctionTool(FunctionTool):
    """A ``FunctionTool`` whose every call is a call of ``ledger_tool``.

    What ``as_function_tool`` returns; the approval helpers find a call's
    ledger tool through it. It is an ordinary ``FunctionTool`` otherwise.
    """

    #: The ``@ledger.tool`` it calls.
    ledger_tool: Tool[Any] = field(kw_only=True, repr=False)
    _calls: _Calls = field(kw_only=True, repr=False, compare=False)


def as_function_tool(
    tool: Tool[Any],
    *,
    name: str | None = None,
    description: str | None = None,
    strict_mode: bool = True,
    failure_error_function: ErrorFunction | None = default_tool_error_function,
    decided_by: DecidedBy = RUN_STATE,
    tell_model: bool = False,
    default_scope: Scope = "turn",
) -> LedgerFunctionTool:
    """The Agents SDK ``FunctionTool`` for a ledger tool.

    ``name`` is what the model calls it (default: the ledger name with every
    character the OpenAI API refuses, such as ``.``, made ``_``);
    ``description`` defaults to the function's docstring, whose parameter
    sections also describe the parameters. ``strict_mode`` is the SDK's
    (every parameter required, no others). ``failure_error_function`` turns
    the tool's own failures into the model's text, as in the SDK's
    ``function_tool``; ``None`` lets them raise. With the SDK's default
    function, a failure the tool declared retryable reads as the SDK's
    "please try again", and a final one (sending it again replays it) as the
    ledger's words: that it failed, with the error and the receipt.
    ``decided_by`` names who decided on the ledger when a call is approved or
    rejected in the SDK's run state (``state.approve(item)``,
    ``state.reject(item)``): a name, or a function of the run context.
    ``tell_model=True`` hands budget refusals, replay divergences and calls
    canceled while they ran to the model as the call's result, instead of
    raising them out of ``Runner.run``. See the module doc for the rest of
    what the model sees and for approvals.
    """
    if not isinstance(tool, Tool):
        raise EffectLedgerValidationError(
            "as_function_tool takes a tool registered with @ledger.tool, got "
            f"{type(tool).__name__}",
            field="tool",
        )
    refuse_names(tool, "the Agents SDK")
    sdk_name = _NOT_IN_NAME.sub("_", tool.name)[:64] if name is None else name
    if not isinstance(sdk_name, str) or not _NAME.fullmatch(sdk_name):
        raise EffectLedgerValidationError(
            f"tool {tool.name!r}: {sdk_name!r} is not a name the OpenAI API accepts "
            "(1 to 64 letters, digits, '_' or '-'); pass name=...",
            field="name",
        )
    if not isinstance(decided_by, str) and not callable(decided_by):
        raise EffectLedgerValidationError(
            f"decided_by must be a name or a function of the run context, got {decided_by!r}",
            field="decided_by",
        )
    if failure_error_function is not None and not callable(failure_error_function):
        raise EffectLedgerValidationError(
            f"failure_error_function must be a function or None, got {failure_error_function!r}",
            field="failure_error_function",
        )
    schema = function_schema(
        _stand_in(tool),
        name_override=sdk_name,
        description_override=description,
        strict_json_schema=strict_mode,
    )
    if schema.takes_context:
        raise EffectLedgerValidationError(
            f"tool {tool.name!r}: its first parameter is the SDK's run context; a ledger "
            "tool's parameters are the call's arguments (its key), so it cannot take one",
            field="fn",
        )
    calls = _Calls(
        tool,
        sdk_name,
        schema.params_pydantic_model,
        failure_error_function,
        decided_by=decided_by,
        tell_model=tell_model,
        default_scope=check_scope(default_scope, "default_scope"),
    )
    return LedgerFunctionTool(
        name=sdk_name,
        description=schema.description or "",
        params_json_schema=schema.params_json_schema,
        on_invoke_tool=calls.invoke,
        strict_json_schema=strict_mode,
        # No policy, no question: the SDK asks a function per call, and fails
        # closed (pauses) on arguments it cannot parse, which would stop runs
        # of tools that never need anyone.
        needs_approval=False if calls.policy is False else calls.needs_approval,
        # Asked by the SDK before each model turn, with the run context: where a
        # rejection made in the run state alone (state.reject) reaches the ledger.
        is_enabled=True if calls.policy is False else calls.mirror_rejections,
        ledger_tool=tool,
        _calls=calls,
    )


def as_function_tools(
    ledger: EffectLedger,
    tools: Iterable[str | Tool[Any]] | None = None,
    *,
    strict_mode: bool = True,
    failure_error_function: ErrorFunction | None = default_tool_error_function,
    decided_by: DecidedBy = RUN_STATE,
    tell_model: bool = False,
    default_scope: Scope = "turn",
) -> list[AgentTool]:
    """``as_function_tool`` for every tool of ``ledger`` (in registration order), or those named.

    ``tools`` holds names or tools of this ledger. Two tools whose SDK names
    would be the same raise; convert those one by one with ``name=``. Typed
    as the SDK's tool list, so it goes straight to ``Agent(tools=...)``;
    each item is a ``LedgerFunctionTool``.
    """
    converted = [
        as_function_tool(
            t,
            strict_mode=strict_mode,
            failure_error_function=failure_error_function,
            decided_by=decided_by,
            tell_model=tell_model,
            default_scope=default_scope,
        )
        for t in chosen_tools(ledger, tools)
    ]
    seen: dict[str, str] = {}
    for t in converted:
        other = seen.setdefault(t.name, t.ledger_tool.name)
        if other != t.ledger_tool.name:
            raise EffectLedgerValidationError(
                f"tools {other!r} and {t.ledger_tool.name!r} would both be called {t.name!r} "
                "by the model; convert them one by one with as_function_tool(tool, name=...)",
                field="tools",
            )
    return list(converted)


def _stand_in(tool: Tool[Any]) -> Callable[..., object]:
    """A function with the tool's signature minus ``effect``: what the SDK builds the schema of."""
    fn = tool.fn
    # Evaluated one parameter at a time, `effect` and the return left out: they
    # may name types imported only for type checkers. Raises naming the
    # parameter whose annotation does not resolve.
    hints = {a.name: a.annotation for a in arguments(tool)}
    params = [p for p in tool.signature.parameters.values() if p.name != EFFECT_PARAMETER]

    def stand_in(*args: object, **kwargs: object) -> object:
        raise NotImplementedError  # only read, never called

    stand_in.__name__ = getattr(fn, "__name__", tool.name)
    stand_in.__doc__ = description(tool) or None  # the wrapped function's, for a partial
    stand_in.__annotations__ = hints
    stand_in.__signature__ = tool.signature.replace(parameters=params)  # type: ignore[attr-defined]
    return stand_in


class _Calls:
    """One converted tool's two doors: the SDK's approval question and its invocation."""

    def __init__(
        self,
        tool: Tool[Any],
        sdk_name: str,
        params_model: type[BaseModel],
        on_error: ErrorFunction | None,
        *,
        decided_by: DecidedBy = RUN_STATE,
        tell_model: bool = False,
        default_scope: Scope = "turn",
    ) -> None:
        self.tool = tool
        self._decided_by = decided_by
        self._tell_model = tell_model
        self.ledger = tool.ledger
        self.sdk_name = sdk_name
        self._params = params_model
        self._on_error = on_error
        # Fixed when the tool and its ledger were made, so asked once.
        self.policy = tool.approval_policy
        self.default_scope: Scope = default_scope

    def arguments(self, raw: str | Mapping[str, Any] | None) -> dict[str, object]:
        """The call's arguments bound as the ledger keys them.

        Raises ``MalformedToolCall`` (with a message for the model) when they
        are not a JSON object, have the wrong JSON types, miss a parameter
        (the checks the SDK's own function tools make) or name one the tool
        does not have.
        """
        values = parse_arguments(raw, self.sdk_name)
        text = _keyable_json(values, self.sdk_name)
        try:
            # JSON mode, strict: the value the model sent must already be of
            # the parameter's type; the tool gets (and the key holds) that
            # value, never a coerced one (pydantic's result is not used).
            self._params.model_validate_json(text, strict=True)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'arguments'}: {error['msg']}"
                for error in exc.errors()
            )
            raise MalformedToolCall(
                f"the arguments for tool {self.sdk_name!r} do not fit its parameters "
                f"({problems}); nothing was run. Send them again with the types its schema "
                "gives.",
                tool=self.sdk_name,
            ) from None
        try:  # what the types do not say: unknown names, positional-only ones
            return self.tool.bind_arguments(values)
        except EffectLedgerValidationError as exc:
            raise MalformedToolCall(str(exc), tool=self.sdk_name) from None

    def tool_call(self, values: dict[str, object], call_id: str | None = None) -> ToolCall:
        """The ledger call, in the current workflow and turn (raises outside a workflow)."""
        return self.tool.call_for(values, call_id=call_id, default_scope=self.default_scope)

    def turn(self, ctx: RunContextWrapper[Any] | None) -> AbstractContextManager[object]:
        """The run's turn around a call: the run's input, unless the application gave
        one (``ledger.workflow(id, turn=...)``) or there is no workflow (the call raises).

        Read once per ``Runner.run``, at its first ledger call, and kept for the
        run on its context (``run_turn_of``): a handoff that rewrites the next
        agent's input (``nest_handoff_history``, an ``input_filter``) changes
        ``turn_input`` mid-run but not the user request the run answers.
        """
        return self._scope(None if ctx is None else run_turn_of(ctx))

    def turn_of(self, items: object) -> AbstractContextManager[object]:
        """``turn`` for a run whose input is ``items``."""
        return self._scope(run_turn(items))

    def _scope(self, turn: str | None) -> AbstractContextManager[object]:
        workflow = self.tool.workflow_id or current_workflow()
        if workflow is None or current_turn(workflow) is not None or turn is None:
            return nullcontext()
        return WorkflowScope(workflow, turn=turn)

    async def needs_approval(
        self, ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
    ) -> bool:
        """The SDK's ``needs_approval``: must this call wait for a person first?

        Yes when its effect waits for one, or when there is no effect yet
        and the ledger's policy says a new one would; then the effect is
        created waiting, so the ledger holds the request the SDK pauses for.
        ``params`` are the SDK's own parse of the arguments (exact integers,
        any size): ones the ledger cannot key are malformed here as in the
        invocation, never an exception out of the run.
        """
        try:
            values = self.arguments(params)
            with self.turn(ctx):
                call = self.tool_call(values, call_id)
            key = self.ledger.idem_key(call)
        except EffectLedgerValidationError:
            # Malformed, or no workflow: the invocation says so (or raises),
            # with nothing stored; there is nothing for a person to decide.
            return False
        effect = await self.ledger.find_by_idem_key(key)
        if effect is not None:
            return effect.status is EffectStatus.REQUIRES_APPROVAL
        policy = self.policy
        if policy is False or (policy is not True and not policy(call)):
            return False
        return await self.park(ctx, values, call_id)

    async def park(
        self, ctx: RunContextWrapper[Any] | None, values: dict[str, object], call_id: str | None
    ) -> bool:
        """Create the effect waiting for a person; True if it waits (it normally does)."""
        try:
            with self.turn(ctx):
                await self.tool.invoke(
                    values, call_id=call_id, run_options=_PARK, default_scope=self.default_scope
                )
        except ApprovalPendingError:
            return True
        except Exception:
            # Another caller got there first and its effect is decided, or
            # failed; the invocation replays the recorded outcome.
            return False
        # It appeared meanwhile, approved, and ran here; the invocation replays it.
        return False

    async def invoke(self, ctx: ToolContext[Any], raw: str) -> object:
        """The SDK's ``on_invoke_tool``: one ledger call, answered in the model's terms."""
        try:
            values = self.arguments(raw)
        except MalformedToolCall as exc:
            return str(exc)
        with self.turn(ctx):
            calls = _calls_in_run(ctx)
            if calls is not None:
                calls.add(ctx.tool_call_id)  # before the call: parallel repeats see it
            try:
                outcome = await self._run(ctx, values)
            except Exception as exc:
                return await self._own_outcome(ctx, exc, values)
        earlier_run = calls is not None and _from_an_earlier_run(outcome, calls)
        return await self._answer(ctx, outcome, earlier_run=earlier_run)

    async def _run(self, ctx: ToolContext[Any], values: dict[str, object]) -> CallOutcome[Any]:
        """The call's outcome; one the run state approved is approved on the ledger first.

        ``state.approve(item)`` is the SDK's human-in-the-loop decision: the
        effect waiting for it is approved on the ledger (``decided_by``), and
        the call runs once. A decision already on the ledger stands.
        """
        try:
            return await self._outcome(ctx, values)
        except ApprovalPendingError as pending:
            if ctx.is_tool_approved(ctx.tool_name, ctx.tool_call_id) is not True:
                raise
            await self.ledger.approve(
                pending.idem_key, by=self.decider(ctx), note="approved in the Agents SDK run state"
            )
        return await self._outcome(ctx, values)

    async def _outcome(self, ctx: ToolContext[Any], values: dict[str, object]) -> CallOutcome[Any]:
        return await self.tool.call_outcome(
            values,
            call_id=ctx.tool_call_id,
            run_options=_NO_WAIT,
            default_scope=self.default_scope,
        )

    async def _answer(
        self, ctx: ToolContext[Any], outcome: CallOutcome[Any], *, earlier_run: bool = False
    ) -> str:
        """What the model reads for the call's outcome: its result (or that it was done
        in an earlier turn, or in an earlier run: ``earlier_run_text``), or its failure.

        A failure goes to ``failure_error_function`` if the application gave
        one (``None``: raised). With the SDK's default one, a retryable
        failure reads that it may be retried, a final one that it failed,
        with the error and the receipt, and that sending it again gives the
        same answer: never "please try again" for a call that will not run.
        """
        error = outcome.error
        if error is None:
            result = outcome.result
            text = (
                result
                if isinstance(result, str)
                else canonical_json(result, field="result").decode()
            )
            if earlier_run and not outcome.from_earlier_turn:
                return earlier_run_text(outcome, text)
            return outcome_text(outcome, text) or text
        if self._on_error is None:
            raise error
        if self._on_error is default_tool_error_function:
            if outcome.retryable:
                return retryable_text(error, outcome.idem_key)
            failure = (
                error
                if isinstance(error, EffectFailedError)
                else await recorded_failure(self.ledger, outcome.idem_key)
            )
            if failure is not None:
                return failure_text(failure)
            timed_out = for_model(error)  # a handler past its deadline
            if timed_out is not None:
                return timed_out
        if not isinstance(error, Exception):
            raise error
        message = self._on_error(ctx, error)
        return await message if inspect.isawaitable(message) else message

    def decider(self, ctx: RunContextWrapper[Any]) -> str:
        """Who decided in the run state, as the receipt records it."""
        if isinstance(self._decided_by, str):
            return self._decided_by
        who = self._decided_by(ctx)
        if not isinstance(who, str) or not who:
            raise EffectLedgerValidationError(
                f"decided_by(context) must return a non-empty name, got {who!r}",
                field="decided_by",
            )
        return who

    async def mirror_rejections(self, ctx: RunContextWrapper[Any], agent: AgentBase) -> bool:
        """The SDK's ``is_enabled``: always True, after denying on the ledger what the run
        state rejected.

        The SDK answers a call rejected with ``state.reject(item)`` itself,
        without invoking the tool; before the next model turn it asks each
        tool whether it is enabled, with the run context. Each effect of
        this tool waiting for a person in the run's workflow whose call id
        the run state rejected is denied here (``decided_by``, and the
        rejection message as the reason), so none is left pending.
        """
        workflow = self.tool.workflow_id or current_workflow()
        if workflow is None:
            return True
        waiting = await self.ledger.list_effects(
            workflow_id=workflow, tool=self.tool.name, status=EffectStatus.REQUIRES_APPROVAL
        )
        for effect in waiting.effects:
            call_id = effect.call_id
            if call_id is None or ctx.is_tool_approved(self.sdk_name, call_id) is not False:
                continue
            reason = ctx.get_rejection_message(self.sdk_name, call_id)
            await self.ledger.deny(
                effect.idem_key,
                reason=reason or "rejected in the Agents SDK run state",
                by=self.decider(ctx),
            )
        return True

    def _for_app(self, exc: Exception) -> str:
        """A ledger outcome the application must see: raised out of ``Runner.run`` as
        itself, or (``tell_model=True``) the model's text."""
        if not self._tell_model:
            raise _through_sdk(exc) from exc.__cause__
        if isinstance(exc, BudgetExceededError):
            return budget_text(exc)
        if isinstance(exc, EffectDeniedError):
            return _decision_text(exc.effect)
        return str(exc)

    async def _own_outcome(
        self, ctx: ToolContext[Any], exc: Exception, values: dict[str, object]
    ) -> str:
        """What the model reads for this call's own ledger outcome; raises what is the app's."""
        if isinstance(exc, (BudgetExceededError, UnrecordedEffectError)):
            return self._for_app(exc)
        if isinstance(exc, EffectDeniedError):
            if exc.status is EffectStatus.CANCELED and may_have_run(exc):
                return self._for_app(exc)
            return _decision_text(exc.effect)
        if isinstance(exc, EffectPayloadMismatchError):
            return self._mismatch_text(exc, values)
        if isinstance(exc, ApprovalPendingError):
            # Put back to wait after the SDK asked (request_approval, a race):
            # the run goes on without it.
            return (
                "This call is waiting for a person's approval and has not run; it cannot "
                "run until a person approves it."
            )
        if isinstance(exc, EffectLedgerValidationError):
            if exc.field != "args":  # no workflow, a result that is not JSON: the app's
                raise exc
            return str(exc)  # the arguments, e.g. too large: the model's to fix
        if isinstance(exc, (EffectStoreError, EffectInFlightError, EffectLedgerInvariantError)):
            raise exc
        # The wait for another worker timing out: the model may call again later.
        text = for_model(exc)
        if text is None:
            raise exc
        return text

    def _mismatch_text(self, exc: EffectPayloadMismatchError, values: dict[str, object]) -> str:
        keys = self.tool.idempotency_keys or ()
        same = _show(values, keys) if keys else "the same arguments"
        return (
            f"An earlier call with {same} used {_show(exc.effect.args, exc.fields)}, so this "
            f"call ({_show(values, exc.fields)}) was not run: calls with {same} must repeat "
            f"{', '.join(exc.fields)}."
        )


def _keyable_json(values: dict[str, object], tool: str) -> bytes:
    """``values`` as JSON text, exactly as the ledger will key them, or ``MalformedToolCall``.

    What the ledger cannot keep exactly (an integer beyond 64 bits, which a
    float would round so that two calls share a key; NaN or a number beyond
    a float; a lone surrogate; absurd nesting) is the model's to fix, never
    silently changed. JSON text parsed by ``parse_arguments`` has been
    checked already; the SDK's own parse (what ``needs_approval`` gets) has not.
    """
    try:
        return canonical_json(values, field="arguments", sort_keys=False)
    except EffectLedgerValidationError as exc:
        raise MalformedToolCall(
            f"the arguments for tool {tool!r} hold a value the ledger cannot keep exactly "
            f"({exc}); nothing was run. Send integers within 64 bits (an id as a string) "
            "and finite numbers.",
            tool=tool,
        ) from None


def _input_items(original: object) -> object:
    """A run's input as the list of items ``turn_input`` holds (a string is one message)."""
    if original is None:
        return None
    try:
        return ItemHelpers.input_to_new_input_list(cast(Any, original))
    except Exception:
        return None


#: The attribute a run's ``Usage`` keeps its turn in (``run_turn_of``).
_RUN_TURN: Final = "_agent_ledger_turn"


def run_turn_of(ctx: RunContextWrapper[Any]) -> str | None:
    """The turn of the run ``ctx`` belongs to: ``run_turn`` of its input as the run's
    first ledger call saw it, kept for the rest of the run.

    The SDK makes a new ``ToolContext`` for every call, but every context of one
    ``Runner.run`` (its tools', its handoffs', its resumption's until it is
    serialised) shares the run's ``Usage`` object, which accrues in place: the
    turn is kept on it, so a handoff that rewrites ``turn_input`` (nested history,
    an input filter removing tool items) does not start another turn mid-run.
    """
    usage = ctx.usage
    kept = getattr(usage, _RUN_TURN, None)
    if isinstance(kept, str):
        return kept
    turn = run_turn(ctx.turn_input)
    if turn is not None:
        # A Usage that takes no attribute: the turn is read at each call, as before.
        with contextlib.suppress(AttributeError, TypeError):
            setattr(usage, _RUN_TURN, turn)
    return turn


#: The attribute a run's ``Usage`` keeps its ledger calls' tool-call ids in (``_calls_in_run``).
_RUN_CALLS: Final = "_agent_ledger_calls"


def _calls_in_run(ctx: RunContextWrapper[Any]) -> set[str] | None:
    """The tool-call ids of the ledger calls the run ``ctx`` belongs to has made (kept
    on its ``Usage``, as its turn is: ``run_turn_of``); None where it cannot be kept."""
    usage = ctx.usage
    calls = getattr(usage, _RUN_CALLS, None)
    if isinstance(calls, set):
        return calls
    calls = set()
    try:
        setattr(usage, _RUN_CALLS, calls)
    except (AttributeError, TypeError):
        return None
    return calls


def _from_an_earlier_run(outcome: CallOutcome[Any], calls: set[str]) -> bool:
    """Whether ``outcome`` is the receipt of a call an earlier run made: answered
    from a receipt that none of this run's tool calls (``calls``) created.

    Judged on what the receipt records (the tool-call id that created it) and
    on the run's own call ids, so a replay of the run reads what the recorded
    run read.
    """
    effect = outcome.effect
    return (
        outcome.replayed
        and outcome.error is None
        and effect is not None
        and effect.call_id is not None
        and effect.call_id not in calls
    )


def run_turn(items: object) -> str | None:
    """The turn of a run whose input is ``items`` (``RunContextWrapper.turn_input``).

    A turn is one user request: a digest of the conversation up to and
    including the user message that started it (what follows that message in
    the input, the turn's own tool calls and outputs, is not part of it). The
    next user message starts another turn, even with the same text, once the
    turn before it finished (ended in an assistant message). A run that died
    before it finished (the model's next call raised, the process was killed)
    leaves its user message and tool items in a session's history; the same
    request sent again right after it (the same user message content,
    following a turn that has no final assistant message) is a retry, so it
    continues that turn: its calls are answered from their receipts.
    Resumptions after an interruption keep the run's input, so they are the
    same turn too. With no user message in the input, the whole input is the
    turn. None for an empty or unreadable input (no turn: a ``scope="turn"``
    call then raises).
    """
    if not items:
        return None
    try:
        from pydantic_core import to_jsonable_python

        listed = to_jsonable_python(items)
        if isinstance(listed, list):
            listed = listed[: _turn_start(listed) + 1] if _is_user_list(listed) else listed
        text = orjson.dumps(listed, option=orjson.OPT_SORT_KEYS)
    except Exception:
        return None
    return "agents-run-" + hashlib.sha256(text).hexdigest()[:32]


def _is_user(item: object) -> bool:
    """Whether an input item is a user message (easy-input or typed ``message``)."""
    return (
        isinstance(item, dict)
        and item.get("role") == "user"
        and item.get("type", "message") == "message"
    )


def _is_user_list(items: list[object]) -> bool:
    return any(_is_user(item) for item in items)


def _finished(segment: list[object]) -> bool:
    """Whether a turn's items (after its user message) end in the assistant's message:
    the run that made them finished rather than dying between a tool and the model."""
    if not segment:
        return False
    last = segment[-1]
    return (
        isinstance(last, dict)
        and last.get("role") == "assistant"
        and last.get("type", "message") == "message"
    )


def _content(item: object) -> object:
    """A message item's content (None for anything else)."""
    return item.get("content") if isinstance(item, dict) else None


def _turn_start(items: list[object]) -> int:
    """The index of the user message that started the last turn in ``items``: the
    last user message, or the one it retries (see ``run_turn``)."""
    users = [i for i, item in enumerate(items) if _is_user(item)]
    k = len(users) - 1
    while k > 0:
        before, now = users[k - 1], users[k]
        if _finished(items[before + 1 : now]) or _content(items[before]) != _content(items[now]):
            break
        k -= 1
    return users[k]


#: Each ledger error class's twin that is also the SDK's ``AgentsException``.
_THROUGH: dict[type[Exception], type[Exception]] = {}


def _through_sdk(error: Exception) -> Exception:
    """``error`` as an exception the SDK lets out of ``Runner.run`` as it is.

    The SDK wraps whatever a tool raises in its ``UserError``, except its own
    ``AgentsException``s. The copy's class is a subclass of both ``error``'s
    and ``AgentsException``, with ``error``'s attributes, so
    ``except BudgetExceededError`` around ``Runner.run`` catches it.
    """
    cls = type(error)
    twin = _THROUGH.get(cls)
    if twin is None:
        twin = cast(
            "type[Exception]",
            type(cls.__name__, (cls, AgentsException), {"__module__": cls.__module__}),
        )
        twin.__qualname__ = cls.__qualname__
        _THROUGH[cls] = twin
    copy = twin.__new__(twin)
    copy.__dict__.update(error.__dict__)
    copy.args = error.args
    cast(Any, copy).run_data = None
    return copy


def _show(values: Mapping[str, object], names: Iterable[str]) -> str:
    return ", ".join(f"{n}={orjson.dumps(values.get(n)).decode()}" for n in names)


def _decision_text(effect: Effect) -> str:
    """What the model reads for a denied or canceled effect (a rejection, a re-sent call)."""
    reason = effect.error.message if effect.error is not None else None
    # Without a reason the ledger records the status itself ("denied").
    because = f" ({reason})" if reason and reason != effect.status.value else ""
    if effect.status is EffectStatus.CANCELED:
        return f"This call was canceled{because}. It will not run again; do not send it again."
    return f"A person denied this call{because}. It did not run and will not; do not send it again."


# -- approvals ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    """An interruption's ledger call: its converted tool, arguments, effect key, and the
    run context it was made in (its turn)."""

    calls: _Calls
    values: dict[str, object]
    key: str
    context: RunContextWrapper[Any] | None
    items: object


async def _ledger_call(
    state: RunState[Any, Any], item: ToolApprovalItem
) -> _Found | MalformedToolCall | None:
    """The ledger call behind an interruption; None for another tool's.

    ``MalformedToolCall`` (returned, with the model's message) when its
    arguments make no ledger call: the SDK pauses on arguments it cannot
    parse without asking the adapter, so such an interruption has no effect
    and never can. The effect is the one recorded with the interruption's
    call id in the current workflow; failing that, the key is made again
    from the tool, the arguments, the workflow and the run's turn, as the
    call made it. Call the helpers inside the same ``ledger.workflow()``.
    """
    agent = getattr(item, "agent", None)
    converted = next(
        (
            t
            for t in getattr(agent, "tools", ())
            if isinstance(t, LedgerFunctionTool) and t.name == item.tool_name
        ),
        None,
    )
    if converted is None:
        return None
    calls = converted._calls
    # The run's input (its turn) and context: the SDK keeps them on the state
    # (its input survives to_string/from_string) with no public accessor.
    context = getattr(state, "_context", None)
    items = _input_items(getattr(state, "_original_input", None))
    call_id = item.call_id
    try:
        values = calls.arguments(item.arguments)
        with calls.turn_of(items):
            key = calls.ledger.idem_key(calls.tool_call(values, call_id))
    except MalformedToolCall as exc:
        return exc  # nothing stored, nothing to decide
    except EffectLedgerValidationError as exc:
        if exc.field != "args":  # no workflow: the application's
            raise
        return MalformedToolCall(str(exc), tool=calls.sdk_name)  # e.g. too large
    workflow = calls.tool.workflow_id or current_workflow()
    if call_id is not None and workflow is not None:
        page = await calls.ledger.list_effects(
            workflow_id=workflow, tool=calls.tool.name, call_id=call_id, limit=1
        )
        if page.effects:
            key = page.effects[0].idem_key
    return _Found(calls, values, key, context, items)


async def _effect(found: _Found, call_id: str | None) -> Effect | None:
    """The call's effect, created waiting for a person if the ledger has none yet."""
    effect = await found.calls.ledger.find_by_idem_key(found.key)
    if effect is None:
        with found.calls.turn_of(found.items):
            await found.calls.park(found.context, found.values, call_id)
        effect = await found.calls.ledger.find_by_idem_key(found.key)
    return effect


def _mirror(state: RunState[Any, Any], item: ToolApprovalItem, effect: Effect | None) -> bool:
    """Give the run state the ledger's decision on ``effect``; False while it has none."""
    if effect is None or effect.status is EffectStatus.REQUIRES_APPROVAL:
        return False
    if effect.status in (EffectStatus.DENIED, EffectStatus.CANCELED):
        state.reject(item, rejection_message=_decision_text(effect))
    else:
        state.approve(item)  # approved (and maybe run since): the call runs or replays
    return True


async def approve(
    state: RunState[Any, Any], item: ToolApprovalItem, *, by: str, note: str | None = None
) -> Effect | None:
    """Approve an interruption on the ledger (``by``, ``note`` on the receipt), then in ``state``.

    Returns the effect. When another decision got to it first, that one
    stands, and ``state`` gets it (a denial is a rejection). For an
    interruption of a tool that is not a ledger tool, or whose arguments do
    not make a call, it only approves in ``state`` and returns None (the
    invocation then tells the model what is wrong with the arguments).
    """
    found = await _ledger_call(state, item)
    if not isinstance(found, _Found):
        state.approve(item)
        return None
    ledger = found.calls.ledger
    return await _decide(state, item, found, lambda: ledger.approve(found.key, by=by, note=note))


async def reject(
    state: RunState[Any, Any], item: ToolApprovalItem, *, by: str, reason: str | None = None
) -> Effect | None:
    """Deny an interruption on the ledger (``by``, ``reason`` on the receipt), then in ``state``.

    The model is told a person denied the call, and why; sent again, it is
    told again and nothing runs. Returns the effect; another decision that
    got there first stands, as for ``approve``. Not a ledger tool's call:
    only rejects in ``state`` and returns None; a call whose arguments make
    no ledger call: rejected in ``state`` with what is wrong with them (the
    model's to fix), and None.
    """
    found = await _ledger_call(state, item)
    if found is None:
        state.reject(item)
        return None
    if isinstance(found, MalformedToolCall):
        state.reject(item, rejection_message=str(found))
        return None
    ledger = found.calls.ledger
    return await _decide(state, item, found, lambda: ledger.deny(found.key, reason=reason, by=by))


async def _decide(
    state: RunState[Any, Any],
    item: ToolApprovalItem,
    found: _Found,
    decision: Callable[[], Awaitable[bool]],
) -> Effect | None:
    """Record ``decision`` on the ledger if the call's effect exists (else nothing is
    decided), then mirror the effect as it now stands into ``state``; returns it."""
    if await _effect(found, item.call_id) is not None:
        await decision()
    effect = await found.calls.ledger.find_by_idem_key(found.key)
    _mirror(state, item, effect)
    return effect


async def sync_decisions(state: RunState[Any, Any]) -> list[ToolApprovalItem]:
    """Copy the ledger's decisions on the run's interruptions into ``state``.

    For decisions made elsewhere (``agent-ledger approve``, another
    service): each interruption whose effect was approved is approved in
    ``state``, each denied or canceled one rejected. Returns the
    interruptions still waiting for a person; resume the run when it is
    empty. One the ledger does not hold yet (its request could not be
    recorded when the run paused) is recorded now, waiting, so it can be
    decided there. Other tools' interruptions are returned untouched.

    An interruption whose arguments make no ledger call (the SDK pauses on
    arguments it cannot parse, say, for a tool with an approval policy) has
    no effect and never will, so nobody could decide it: it is rejected in
    ``state`` with what is wrong with the arguments, which the model reads
    when the run resumes. Nothing is stored for it.
    """
    waiting: list[ToolApprovalItem] = []
    for item in state.get_interruptions():
        found = await _ledger_call(state, item)
        if isinstance(found, MalformedToolCall):
            state.reject(item, rejection_message=str(found))
        elif found is None or not _mirror(state, item, await _effect(found, item.call_id)):
            waiting.append(item)
    return waiting


# -- model calls -----------------------------------------------------------------------------


class LedgerModel(Model):
    """An Agents SDK ``Model`` whose every call is recorded through ``ledger.llm()``.

    ``Agent(model=LedgerModel(model, ledger, name="gpt-4.1", pricing=...))``,
    or every agent of a run at once with
    ``RunConfig(model_provider=LedgerModelProvider(provider, ledger, ...))``.
    Each ``get_response`` is one model-call effect of the current workflow,
    keyed by what the model is sent (instructions, input, settings, tool
    and handoff names and schemas, output schema), with its token usage and
    price (``pricing(provider, model, usage)``):

    * under ``ledger.workflow(id, budget=Budget(usd=...))`` the call reserves
      ``estimate`` first and is refused (``BudgetExceededError``, out of
      ``Runner.run``) before the wrapped model is called;
    * the same request again (a resumed run, a replay with
      ``ledger.replay(...)``) is answered from the receipt: the wrapped
      model is not called.

    Streaming (``Runner.run_streamed``) is not recorded: it raises, naming
    ``Runner.run``.
    """

    def __init__(
        self,
        model: Model,
        ledger: EffectLedger,
        *,
        name: str,
        provider: str = "openai",
        pricing: Pricing | None = None,
        estimate: LedgerUsage | None = None,
    ) -> None:
        if not isinstance(model, Model):
            raise EffectLedgerValidationError(
                f"LedgerModel wraps an Agents SDK Model, got {model!r}", field="model"
            )
        self.model = model
        self.ledger = ledger
        self.name = name
        self.provider = provider
        self.pricing = pricing
        self.estimate = estimate

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[AgentTool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        **kwargs: Any,
    ) -> ModelResponse:
        """The wrapped model's response, through the ledger (see the class doc)."""
        request = _jsonable(
            {
                "instructions": system_instructions,
                "input": input,
                "settings": model_settings.to_json_dict(),
                "tools": [[t.name, getattr(t, "params_json_schema", None)] for t in tools],
                "handoffs": [[h.tool_name, h.input_json_schema] for h in handoffs],
                "output": None
                if output_schema is None or output_schema.is_plain_text()
                else output_schema.json_schema(),
                **{k: v for k, v in kwargs.items() if v is not None},
            }
        )

        async def call(_: object) -> ModelResponse:
            return await self.model.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                **kwargs,
            )

        reply = await self.ledger.llm(
            call,
            provider=self.provider,
            model=self.name,
            request=cast("JSONValue", request),
            read=_model_result,
            pricing=self.pricing,
            estimate=self.estimate,
        )
        return _model_response(reply.response)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        """Not recorded: raises. Use ``Runner.run``, whose calls are."""
        raise EffectLedgerValidationError(
            "LedgerModel records whole responses; a streamed run (Runner.run_streamed) is not "
            "recorded. Use Runner.run, or stream with the unwrapped model (its calls then "
            "have no receipt and no budget).",
            field="model",
        )


class LedgerModelProvider(ModelProvider):
    """A ``ModelProvider`` whose models are ``LedgerModel``s: every agent of the run
    (``RunConfig(model_provider=...)``) has its model calls recorded."""

    def __init__(
        self,
        provider: ModelProvider,
        ledger: EffectLedger,
        *,
        provider_name: str = "openai",
        pricing: Pricing | None = None,
        estimate: LedgerUsage | None = None,
    ) -> None:
        self.provider = provider
        self.ledger = ledger
        self.provider_name = provider_name
        self.pricing = pricing
        self.estimate = estimate

    def get_model(self, model_name: str | None) -> Model:
        return LedgerModel(
            self.provider.get_model(model_name),
            self.ledger,
            name=model_name or "default",
            provider=self.provider_name,
            pricing=self.pricing,
            estimate=self.estimate,
        )


def _jsonable(value: object) -> object:
    """``value`` as plain JSON values (pydantic models and TypedDicts alike)."""
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value)


_OUTPUT: Final = TypeAdapter(list[TResponseOutputItem])


def _model_result(response: ModelResponse) -> LLMResult:
    """A ``ModelResponse`` as ``ledger.llm()`` records it: its JSON and its usage."""
    usage = response.usage
    return LLMResult(
        response=cast(
            "JSONValue",
            {
                "output": _jsonable(response.output),
                "usage": {
                    "requests": usage.requests,
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "total_tokens": usage.total_tokens,
                },
                "response_id": response.response_id,
            },
        ),
        usage=LedgerUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens),
    )


def _model_response(recorded: object) -> ModelResponse:
    """The ``ModelResponse`` a recorded reply stands for (first call and replay alike)."""
    data = cast("dict[str, Any]", recorded)
    counts = data.get("usage") or {}
    return ModelResponse(
        output=_OUTPUT.validate_python(data.get("output") or []),
        usage=SdkUsage(
            requests=counts.get("requests", 0),
            input_tokens=counts.get("input_tokens", 0),
            output_tokens=counts.get("output_tokens", 0),
            total_tokens=counts.get("total_tokens", 0),
        ),
        response_id=data.get("response_id"),
    )
