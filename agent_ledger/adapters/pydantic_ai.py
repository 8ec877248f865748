"""pydantic-ai: ledger tools for an ``Agent``, approvals as deferred tools, model calls recorded.

``as_pydantic_ai_tool(tool)`` gives a tool registered with ``@ledger.tool``
to a pydantic-ai ``Agent`` (``Agent(tools=[...])``), in pydantic-ai's own
terms:

* **The run is the turn.** Calls are keyed with ``scope="turn"`` unless the
  tool (``@ledger.tool(scope=...)``) or the adapter (``scope=``) says
  otherwise: a model re-issuing a call, a retried step or a resumed run
  within one user request is answered from the receipt, and the same
  arguments in a later run (a new request) run again. The turn is the turn
  of ``ledger.workflow(id, turn=...)`` around the run if it gives one, else
  the ``run_id`` of the run whose model response made the call (so a run
  resumed from its message history, or with ``DeferredToolResults``, is the
  same turn), else the running ``run_id``. Pass ``run_id=`` to
  ``agent.run`` to make a restarted request the same turn. The tool-call id
  is recorded on every effect (``scope="call"`` keys by it). The workflow
  is the tool's own, or the ``ledger.workflow(...)`` around the run, or else
  pydantic-ai's ``conversation_id``.
* **Approvals are deferred tools.** A call the ledger sends to a person
  ends the run with ``DeferredToolRequests`` (put it in the agent's
  ``output_type``): pydantic-ai's ``ApprovalRequired`` carries the receipt
  in ``requests.metadata[tool_call_id]["agent_ledger"]`` (tool, args, key,
  workflow, reason). Answer with ``DeferredToolResults`` and pass it through
  ``record_decisions(ledger, requests, results, by=...)`` before the next
  run: each approval or denial is recorded in the ledger with who decided
  (``results.answered_by``, else ``by``). The resumed run then runs an
  approved call once; a denied one is answered by pydantic-ai with the
  denial, and the effect is denied in the ledger, not left pending.
* **ModelRetry is a retryable failure.** A tool raising ``ModelRetry``
  records it as a retryable failure (``retryable=``, docs/tools.md): the
  model reads the message, and its corrected call (or the same arguments)
  runs the tool again instead of replaying the failure.
* **What the model reads, what the application gets.** Arguments that do
  not fit ask the model to retry (``ModelRetry``); a denial, a payload
  mismatch or a handler past its deadline are told to the model
  (``ToolFailed``, with ``for_model``'s text); a call answered from an
  earlier turn's receipt says so. A budget refusal (``BudgetExceededError``),
  a replay that diverged (``UnrecordedEffectError``), store errors and the
  tool's own exceptions end ``agent.run`` with that exception.

``LedgerModel(model, ledger, pricing=...)`` wraps any pydantic-ai model so
that each model request is one ``ledger.llm()`` call: usage and price on
the receipt, ``Budget(usd=...)`` refusing before the provider is called,
and a replay serving the recorded responses without calling the model.

A ledger tool given to ``Agent(tools=[tool])`` directly also works (a
plain function to pydantic-ai): it runs in the ``ledger.workflow(...)``
around the run, keyed by the tool's own scope, with ``RunContext`` passed
through (``Tool.context_parameter``). The adapter adds the rest above.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Final

from agent_ledger.adapters._common import missing_extra

try:
    from pydantic_ai import ModelRetry, RunContext
    from pydantic_ai.exceptions import ApprovalRequired, ToolFailed
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import (
        DeferredToolRequests,
        DeferredToolResults,
        ToolApproved,
        ToolDenied,
    )
    from pydantic_ai.tools import (
        Tool as PydanticAITool,
    )
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing_extra(__name__, "pydantic-ai", "pydantic-ai", "(pydantic-ai-slim)") from exc
import orjson
from pydantic import TypeAdapter

from agent_ledger.adapters._messages import (
    answer_failure,
    earlier_turn_text,
    for_model,
    retryable_text,
)
from agent_ledger.adapters._signature import (
    REQUIRED,
    JsonArguments,
    arguments,
    check_storable,
    description,
    dressed,
    name_for,
    refuse_names,
)
from agent_ledger.calls import Scope, check_scope
from agent_ledger.context import current_turn, current_workflow, enter_workflow, exit_workflow
from agent_ledger.effects import JSONValue, Usage
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    EffectTimeoutError,
)
from agent_ledger.options import UNSET, RunOptions
from agent_ledger.tools import CallOutcome, LLMResult, Pricing, Tool

__all__ = [
    "METADATA_KEY",
    "LedgerModel",
    "as_pydantic_ai_tool",
    "record_decisions",
]

#: Where ``DeferredToolRequests.metadata[tool_call_id]`` keeps a call's receipt.
METADATA_KEY: Final = "agent_ledger"

#: What model providers accept in a tool name (OpenAI's rule; pydantic-ai's models follow it).

_MESSAGES: Final = TypeAdapter(list[ModelMessage])
_RESPONSE: Final = TypeAdapter(ModelResponse)
#: Fields of a recorded message that differ on every run of the same request:
#: left out of a model call's key, so a replay (or a resumed run) finds it.
_VOLATILE: Final = frozenset({"timestamp", "run_id", "conversation_id", "provider_response_id"})


# -- tools -----------------------------------------------------------------------------


def as_pydantic_ai_tool(
    tool: Tool[Any],
    *,
    name: str | None = None,
    description: str | None = None,
    scope: Scope | None = None,
    by: str = "pydantic-ai",
    max_retries: int | None = None,
) -> PydanticAITool[Any]:
    """A pydantic-ai ``Tool`` that runs ``tool`` through its ledger (see the module doc).

    ``name`` defaults to the ledger name with characters model providers
    refuse (``.``, spaces) replaced by ``_``; ``description`` to the
    function's docstring. ``scope`` is the adapter's default scope for this
    tool (``"turn"`` unless given), used when the tool declares none. ``by``
    is recorded as who approved a call that pydantic-ai resumed as approved
    without ``record_decisions`` having recorded it (``DeferredToolResults``
    passed straight to ``agent.run``). ``max_retries`` is pydantic-ai's
    (how many ``ModelRetry`` answers the model gets for this tool).

    The function's arguments (a leading ``RunContext`` left out) are the
    schema; pydantic-ai validates the model's arguments into Python objects,
    which are turned back into JSON before the key is made, as from every
    adapter (see ``agent_ledger.adapters._signature``).
    """
    if not isinstance(tool, Tool):
        raise EffectLedgerValidationError(
            f"as_pydantic_ai_tool takes a ledger tool (from @ledger.tool), got {tool!r}",
            field="tool",
        )
    default_scope = check_scope("turn" if scope is None else scope)
    refuse_names(tool, "pydantic-ai")
    args = [arg for arg in arguments(tool) if arg.name != tool.context_parameter]
    to_json = JsonArguments(tool.name, {arg.name: arg.annotation for arg in args})
    options = _options(tool)

    async def run_ledger_tool(ctx: RunContext[Any], **kwargs: Any) -> Any:
        return await _call(tool, ctx, to_json(kwargs, tool.name), options, default_scope, by)

    tool_name = name_for(tool.name) if name is None else name
    parameters = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunContext)
    ]
    parameters += [
        inspect.Parameter(
            arg.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=arg.annotation,
            default=inspect.Parameter.empty if arg.default is REQUIRED else arg.default,
        )
        for arg in args
    ]
    # pydantic-ai builds the schema from the signature and the type hints.
    run_ledger_tool.__annotations__ = {
        "ctx": RunContext,
        **{arg.name: arg.annotation for arg in args},
        "return": Any,
    }
    text = _description(tool) if description is None else description
    dressed(run_ledger_tool, tool_name, text, inspect.Signature(parameters))
    return PydanticAITool(
        run_ledger_tool,
        takes_ctx=True,
        name=tool_name,
        description=text,
        max_retries=max_retries,
    )


def _description(tool: Tool[Any]) -> str:
    return description(tool) or f"Runs {tool.name} (recorded by agent-ledger)."


def _options(tool: Tool[Any]) -> RunOptions:
    """The run options every adapter call adds: never wait for a person (the run
    ends with a deferred request instead), and ``ModelRetry`` is retryable
    besides whatever the tool declared."""
    own = tool.run_settings[0]
    declared = UNSET if own is None else own.retryable
    retryable: Any
    if declared is UNSET or declared is None:
        retryable = ModelRetry
    elif isinstance(declared, type):
        retryable = (declared, ModelRetry)
    elif isinstance(declared, tuple):
        retryable = (*declared, ModelRetry)
    else:
        predicate: Callable[[BaseException], bool] = declared

        def retryable(error: BaseException) -> bool:
            return isinstance(error, ModelRetry) or bool(predicate(error))

    return RunOptions(wait_for_approval=False, retryable=retryable)


async def _call(
    tool: Tool[Any],
    ctx: RunContext[Any],
    values: dict[str, Any],
    options: RunOptions,
    default_scope: Scope,
    by: str,
) -> Any:
    """One model call of ``tool``: run it in the run's workflow and turn, and answer
    pydantic-ai in its terms (a value, ``ModelRetry``, ``ToolFailed``,
    ``ApprovalRequired``, or the exception the application must see)."""
    try:
        values = tool.bind_arguments(values)
        check_storable(tool, values)
    except EffectLedgerValidationError as exc:
        raise ModelRetry(str(exc)) from None
    workflow_id = tool.workflow_id or current_workflow() or ctx.conversation_id
    if workflow_id is None:
        raise EffectLedgerValidationError(
            f"tool {tool.name!r} ran outside a workflow and the run has no conversation id; "
            'run the agent inside `async with ledger.workflow("<id>"):`. Nothing was stored.',
            field="workflow_id",
        )
    turn = current_turn(workflow_id) or _turn_of(ctx)
    # The run's workflow and turn for this call only; the budgets in force stay as they are.
    marker = object()
    enter_workflow(marker, workflow_id, turn=turn)
    try:
        return await _answer(tool, ctx, values, options, default_scope, by)
    finally:
        exit_workflow(marker)


async def _answer(
    tool: Tool[Any],
    ctx: RunContext[Any],
    values: dict[str, Any],
    options: RunOptions,
    default_scope: Scope,
    by: str,
) -> Any:
    context = ctx if tool.context_parameter is not None else None
    for attempt in range(2):  # a second time only after recording an approval pydantic-ai gave
        try:
            outcome = await tool.call_outcome(
                values,
                call_id=ctx.tool_call_id,
                run_options=options,
                default_scope=default_scope,
                context=context,
            )
        except ApprovalPendingError as pending:
            if ctx.tool_call_approved and attempt == 0:
                # DeferredToolResults approved it without record_decisions: record it now.
                who = _metadata_by(ctx.tool_call_metadata) or by
                await tool.ledger.approve(pending.idem_key, by=who)
                continue
            raise ApprovalRequired(
                metadata={METADATA_KEY: _receipt(tool, values, pending)}
            ) from None
        except (EffectDeniedError, EffectPayloadMismatchError, EffectTimeoutError) as exc:
            # HandlerTimeoutError is an EffectTimeoutError: the model reads what happened.
            raise ToolFailed(for_model(exc) or str(exc)) from None
        if outcome.error is None:
            if outcome.from_earlier_turn:
                # Never as if it had just happened: when, which receipt, what it returned.
                text = orjson.dumps(outcome.result).decode()
                return earlier_turn_text(outcome, text)
            return outcome.result
        raise _failure(outcome)
    raise AssertionError("unreachable: the second pass raises or returns")


def _failure(outcome: CallOutcome[Any]) -> BaseException:
    """What pydantic-ai gets for the tool's failure, alike on the first call and replays:
    ``ModelRetry`` or ``ToolFailed`` again (with the recorded message) when the tool
    raised one; ``ModelRetry`` for any other retryable failure (calling again runs
    it again); ``ToolFailed`` for a handler past its deadline; else the exception,
    which ends the run."""
    error = outcome.error
    assert error is not None
    if isinstance(error, (ModelRetry, ToolFailed)):
        return error
    if outcome.retryable:
        return ModelRetry(retryable_text(error, outcome.idem_key))
    if isinstance(error, EffectTimeoutError):  # HandlerTimeoutError: it may have taken effect
        return ToolFailed(for_model(error) or str(error))
    if isinstance(error, EffectFailedError):
        retry = answer_failure(error, error, ModelRetry, ModelRetry)
        if isinstance(retry, ModelRetry):
            return retry
        return answer_failure(error, error, ToolFailed, ToolFailed)
    return error


def _turn_of(ctx: RunContext[Any]) -> str | None:
    """The run whose model response made this tool call (the turn), from the history.

    A run resumed with ``DeferredToolResults`` or from its message history is a new
    ``agent.run`` with a new ``run_id``; the response that asked for the call keeps
    the run that made it. Falls back to the running ``run_id``.
    """
    call_id = ctx.tool_call_id
    for message in reversed(ctx.messages):
        if not isinstance(message, ModelResponse):
            continue
        for part in message.parts:
            if isinstance(part, ToolCallPart) and part.tool_call_id == call_id:
                return message.run_id or ctx.run_id
    return ctx.run_id


def _metadata_by(metadata: object) -> str | None:
    """``by`` from ``DeferredToolResults.metadata[tool_call_id]``, if the application set it."""
    if isinstance(metadata, Mapping):
        found = metadata.get("by")
        if isinstance(found, str) and found:
            return found
    return None


def _receipt(
    tool: Tool[Any], values: Mapping[str, Any], pending: ApprovalPendingError
) -> dict[str, Any]:
    """What ``DeferredToolRequests.metadata`` carries for a call waiting for a person."""
    return {
        "tool": tool.name,
        "args": dict(values),
        "key": pending.idem_key,
        "workflow_id": current_workflow(),
        "turn": current_turn(),
        "reason": f"{tool.name} needs a person's approval before it runs",
    }


# -- decisions ---------------------------------------------------------------------------


async def record_decisions(
    ledger: Any,
    requests: DeferredToolRequests,
    results: DeferredToolResults,
    *,
    by: str | None = None,
) -> DeferredToolResults:
    """Record the application's approvals and denials of ``requests`` in the ledger.

    For each approval request that carries a ledger receipt and has an
    answer in ``results.approvals`` (``True``/``ToolApproved`` or
    ``False``/``ToolDenied``), the effect is approved or denied
    (``ledger.approve``/``ledger.deny``) with who decided: the call's
    ``results.answered_by`` entry, else ``by``. A ``ToolDenied`` message is
    the denial's reason. Returns ``results``, to pass to the next
    ``agent.run(..., deferred_tool_results=results)``.

    A decision made elsewhere first (``agent-ledger approve``/``deny``)
    stands: the ledger keeps it, and the resumed call is answered by it (a
    call the ledger denied tells the model so, whatever ``results`` said).
    """
    for part in requests.approvals:
        receipt = requests.metadata.get(part.tool_call_id, {}).get(METADATA_KEY)
        answer = results.approvals.get(part.tool_call_id)
        if not isinstance(receipt, Mapping) or answer is None:
            continue
        key = receipt.get("key")
        if not isinstance(key, str):
            continue
        who = results.answered_by.get(part.tool_call_id, by)
        if answer is True or isinstance(answer, ToolApproved):
            await ledger.approve(key, by=who)
        elif answer is False or isinstance(answer, ToolDenied):
            reason = answer.message if isinstance(answer, ToolDenied) else None
            await ledger.deny(key, reason, by=who)
    return results


# -- model calls -------------------------------------------------------------------------


class LedgerModel(WrapperModel):
    """A pydantic-ai model whose every request is one ``ledger.llm()`` call.

    ``LedgerModel(model, ledger, pricing=...)``: the request (messages less
    their timestamps and run ids, the tools offered, the settings) is the
    key, recorded as tool ``llm.<system>``; the wrapped model's response and
    usage are recorded on the receipt, priced by ``pricing``. Under
    ``ledger.workflow(id, budget=Budget(usd=...))`` a request that does not
    fit raises ``BudgetExceededError`` before the wrapped model is called;
    inside ``ledger.replay(...)`` the recorded responses are served and the
    model is never called. ``estimate`` is the usage reserved per request
    under a budget. Streaming (``run_stream``) is refused: its response is
    not one value the ledger can record before handing it on.
    """

    def __init__(
        self,
        wrapped: Any,
        ledger: Any,
        *,
        pricing: Pricing | None = None,
        estimate: Usage | None = None,
    ) -> None:
        super().__init__(wrapped)
        self._ledger = ledger
        self._pricing = pricing
        self._estimate = estimate

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        wrapped = self.wrapped

        async def call_model(_request: object) -> LLMResult:
            response = await wrapped.request(messages, model_settings, model_request_parameters)
            usage = Usage(
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
            )
            return LLMResult(
                response=_stable(_RESPONSE.dump_python(response, mode="json")), usage=usage
            )

        reply = await self._ledger.llm(
            call_model,
            provider=self.system,
            model=self.model_name,
            request=_request(messages, model_settings, model_request_parameters),
            pricing=self._pricing,
            estimate=self._estimate,
        )
        return _RESPONSE.validate_python(reply.response)

    async def request_stream(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise EffectLedgerValidationError(
            "LedgerModel records whole responses: run the agent with agent.run() (or "
            "run_sync), not a streamed run; nothing was called",
            field="model",
        )


def _request(
    messages: list[ModelMessage],
    settings: ModelSettings | None,
    parameters: ModelRequestParameters,
) -> JSONValue:
    """A model request as JSON, without what differs between runs of the same request."""
    tools = [
        {"name": t.name, "description": t.description, "parameters": t.parameters_json_schema}
        for t in (*parameters.function_tools, *parameters.output_tools)
    ]
    return {
        "messages": _stable(_MESSAGES.dump_python(messages, mode="json")),
        "tools": _stable(tools),
        "settings": _stable(dict(settings or {})),
    }


def _stable(value: Any) -> Any:
    """``value`` (JSON) without the volatile fields (``_VOLATILE``), recursively."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value
