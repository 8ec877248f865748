"""Model calls as effects: ``await ledger.llm(call_fn, provider=..., model=..., request=...)``.

A model call is an ordinary effect keyed over (workflow, provider, model,
request): asked twice, it runs once and the second call gets the recorded
response, as a replay or another worker would. Its handler calls the
provider and returns the response with its token usage, priced by the
caller's pricing callback (no price table is built in: prices change, and
differ by contract); the engine records the three in one statement, so a
receipt never lacks what its call cost. Under a budget the call is gated
like a tool call (``_budget.gate``), counting dollars and tokens.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from agent_ledger.budgets import Budget, Spend, usd_to_micros
from agent_ledger.calls import ToolCall
from agent_ledger.context import current_turn, current_workflow, recording
from agent_ledger.effects import (
    MAX_USAGE_COST_USD,
    Effect,
    FailedWithUsage,
    JSONValue,
    Usage,
    WithUsage,
    is_usd_amount,
)
from agent_ledger.errors import EffectLedgerInvariantError, EffectLedgerValidationError
from agent_ledger.options import UNSET, RunOptions
from agent_ledger.stores.budget_base import check_hold_ttl_ms
from agent_ledger.tools._budget import (
    DEFAULT_HOLD_TTL_MS,
    LLM_UNITS,
    Threads,
    gate,
    llm_charge,
    open_budgets,
)

if TYPE_CHECKING:
    from agent_ledger.core import LedgerCore

__all__ = ["LLMReply", "LLMResult", "Pricing", "call_llm"]

#: ``pricing(provider, model, usage) -> US dollars`` for one call's tokens.
Pricing: TypeAlias = Callable[[str, str, Usage], float]

#: The tool name a model call's effect is recorded under: ``llm.<provider>``.
TOOL_PREFIX: Final = "llm."

logger = logging.getLogger("agent_ledger")


@dataclass(frozen=True, slots=True)
class LLMResult:
    """What a model call's ``call_fn`` returns: the response as JSON, and its usage.

    The adapters build it from the SDKs' own objects
    (``agent_ledger.adapters.openai.llm_result``, ``...anthropic.llm_result``).
    ``usage.cost_usd`` may be left None: the pricing callback fills it in.
    """

    response: JSONValue
    usage: Usage


@dataclass(frozen=True, slots=True)
class LLMReply:
    """What ``ledger.llm()`` returns: the recorded response, its usage, and the receipt.

    The same on the first call and on every replay (both read the receipt),
    so code after a model call cannot tell a fresh answer from a recorded one.
    """

    response: JSONValue
    usage: Usage | None
    effect: Effect


def _price(pricing: Pricing, provider: str, model: str, usage: Usage) -> float:
    """The callback's price for ``usage``, checked: a finite number of dollars >= 0.

    A callback that raises (or cannot take the three arguments) fails the
    same way as one that returns garbage, with its error as ``__cause__``.
    """
    try:
        cost = pricing(provider, model, usage)
    except Exception as exc:
        raise EffectLedgerValidationError(
            f"pricing({provider!r}, {model!r}, ...) raised {type(exc).__name__}: {exc}; it "
            "must take (provider, model, usage) and return a number of US dollars",
            field="pricing",
        ) from exc
    if not is_usd_amount(cost):
        raise EffectLedgerValidationError(
            f"pricing({provider!r}, {model!r}, ...) must return a finite number of US "
            f"dollars from 0 to {MAX_USAGE_COST_USD:_}, got {cost!r}",
            field="pricing",
        )
    return float(cost)


def _spend(usage: Usage) -> Spend:
    """What a model call's ``usage`` counts in a budget (``llm_charge``'s units)."""
    cost = 0 if usage.cost_usd is None else usd_to_micros(usage.cost_usd, field="cost_usd")
    return Spend(cost, usage.input_tokens, usage.output_tokens, 0)


def _limits_model_calls(budget: Budget) -> bool:
    return (
        budget.usd is not None
        or budget.input_tokens is not None
        or budget.output_tokens is not None
    )


def _plus(before: Usage | None, usage: Usage) -> Usage:
    return usage if before is None else before + usage


def _describe(value: object) -> str:
    if isinstance(value, LLMResult):
        return f"an LLMResult whose usage is {type(value.usage).__name__}"
    return type(value).__name__


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise EffectLedgerValidationError(
            f"{name} must be a non-empty string, got {value!r}. Nothing was stored.", field=name
        )
    return value


async def call_llm(
    ledger: LedgerCore[object],
    call_fn: Callable[[Any], object],
    *,
    provider: str,
    model: str,
    request: JSONValue,
    pricing: Pricing | None = None,
    estimate: Usage | None = None,
    read: Callable[[Any], LLMResult] | None = None,
    workflow_id: str | None = None,
    run_options: RunOptions | None = None,
    hold_ttl_ms: int = DEFAULT_HOLD_TTL_MS,
) -> LLMReply:
    """``EffectLedger.llm`` (see there)."""
    if not callable(call_fn):
        raise EffectLedgerValidationError(
            f"call_fn must be callable (it calls the provider), got {call_fn!r}. "
            "Nothing was stored.",
            field="call_fn",
        )
    provider = _text(provider, "provider")
    model = _text(model, "model")
    for name, fn in (("pricing", pricing), ("read", read)):
        if fn is not None and not callable(fn):
            raise EffectLedgerValidationError(
                f"{name} must be callable or None, got {fn!r}. Nothing was stored.", field=name
            )
    if estimate is not None and not isinstance(estimate, Usage):
        raise EffectLedgerValidationError(
            f"estimate must be a Usage (the tokens you expect), got {estimate!r}. "
            "Nothing was stored.",
            field="estimate",
        )
    check_hold_ttl_ms(hold_ttl_ms)  # the bound every store keeps
    if isinstance(run_options, RunOptions) and run_options.retryable not in (UNSET, None):
        # A retry clears the receipt's usage and books the larger attempt's:
        # a paid failed attempt would go uncounted.
        raise EffectLedgerValidationError(
            "ledger.llm() takes no retryable=: a model call's attempts are each paid, and "
            "the receipt keeps one usage. Retry a failed model call with a RetryPolicy "
            "(RunOptions(retry=...)) inside the call. Nothing was stored.",
            field="retryable",
        )
    workflow = workflow_id if workflow_id is not None else current_workflow()
    if workflow is None:
        raise EffectLedgerValidationError(
            "ledger.llm() was called outside a workflow, so it has no key. Call it inside "
            '`async with ledger.workflow("<id>"):`, or pass workflow_id=. Nothing was stored.',
            field="workflow_id",
        )
    # In a known turn (ledger.workflow(id, turn=...), or one an adapter derived)
    # a model call is keyed by it: the same prompt in a later turn is a new
    # question and calls the model again; retries, resumes and replays of the
    # turn are answered from the receipt. Without a turn: once per workflow.
    turn = current_turn(workflow)
    call = ToolCall(
        workflow_id=workflow,
        tool=TOOL_PREFIX + provider,
        args={"provider": provider, "model": model, "request": request},
        scope="workflow" if turn is None else "turn",
        turn=turn,
    )
    idem_key = ledger.idem_key(call)  # checks the request is JSON, before anything runs
    scopes = await open_budgets(ledger)
    if pricing is None and any(s.budget is not None and s.budget.usd is not None for s in scopes):
        raise EffectLedgerValidationError(
            f"workflow {scopes[0].workflow_id!r} has a budget in dollars, so ledger.llm() "
            "needs pricing=(provider, model, usage) -> USD to know what calls cost. "
            "Nothing was stored.",
            field="pricing",
        )
    limited = [s for s in scopes if s.budget is not None and _limits_model_calls(s.budget)]
    if estimate is None and limited:
        raise EffectLedgerValidationError(
            f"workflow {limited[0].workflow_id!r} has a budget in dollars or tokens, so "
            "ledger.llm() needs estimate=Usage(input_tokens=..., output_tokens=...): the most "
            "the call can consume (the prompt's tokens, and max_tokens for the output). It is "
            "reserved before the provider is called, so calls in flight together never take "
            "more than the limit. Nothing was stored.",
            field="estimate",
        )
    expected = estimate if estimate is not None else Usage()
    # Asked once before anything runs, so a broken callback fails here, not
    # after the provider was paid.
    expected_usd = (
        _price(pricing, provider, model, expected)
        if pricing is not None
        else expected.cost_usd or 0.0
    )
    # What a call that answered is charged when its own cost cannot be worked
    # out: what was reserved for it (unknown without an estimate).
    fallback_cost = expected_usd if estimate is not None else None
    sync_call = not inspect.iscoroutinefunction(call_fn)

    def answered(before: Usage | None, value: object) -> WithUsage:
        """The provider answered and was paid: from here on, whatever goes
        wrong, the effect fails with what the call consumed."""
        try:
            result = read(value) if read is not None else value
            if not isinstance(result, LLMResult) or not isinstance(result.usage, Usage):
                raise EffectLedgerValidationError(
                    "call_fn must return an LLMResult(response=..., usage=Usage(...)) (the "
                    "adapters' llm_result() makes one from an SDK response), or pass read= to "
                    f"turn what it returns into one; got {_describe(result)}",
                    field="call_fn",
                )
        except Exception as exc:
            spent = Usage(expected.input_tokens, expected.output_tokens, fallback_cost)
            logger.warning(
                "model call %s answered, but its usage could not be read (%s); it is "
                "recorded at its estimate, %s",
                call.tool,
                exc,
                spent,
            )
            raise FailedWithUsage(exc, _plus(before, spent)) from exc
        usage = result.usage
        if pricing is not None:
            try:
                usage = replace(usage, cost_usd=_price(pricing, provider, model, usage))
            except Exception as exc:
                usage = replace(usage, cost_usd=fallback_cost)
                logger.warning(
                    "model call %s answered, but pricing(...) failed on its usage (%s); it "
                    "is recorded at the estimate's price, %s",
                    call.tool,
                    exc,
                    usage,
                )
                raise FailedWithUsage(exc, _plus(before, usage)) from exc
        return WithUsage(result.response, _plus(before, usage))

    #: The provider errors of this call's runs that consumed nothing: recorded
    #: retryable (``provider_error``), so the turn's next call asks the model again.
    provider_errors: list[Exception] = []

    def unanswered(before: Usage | None, exc: Exception) -> Exception:
        """What a run whose provider call raised fails with: ``exc`` as it is
        (nothing consumed), or, after a reopen, with what earlier runs consumed."""
        if before is None:
            provider_errors.append(exc)
            return exc
        return FailedWithUsage(exc, before)

    def provider_error(exc: BaseException) -> bool:
        """Whether ``exc`` is the provider's failure to answer, with nothing consumed.

        Such a failure is no answer to the question: it is recorded retryable,
        so a retry or resume of the turn calls the model again (the failure
        stays in the receipt's history). A call that was answered and paid
        for but cannot end well (``FailedWithUsage``: its usage unreadable,
        its pricing failed, or earlier paid runs after a reopen) stays final:
        a retry would clear the receipt's usage and pay again.
        """
        return any(exc is seen for seen in provider_errors)

    async def awaited(before: Usage | None, pending: Awaitable[object]) -> WithUsage:
        try:
            value = await pending
        except Exception as exc:
            failure = unanswered(before, exc)
            if failure is exc:
                raise
            raise failure from exc
        return answered(before, value)

    async def handler(effect: Effect) -> WithUsage:
        # After a reopen the receipt already holds what earlier runs consumed:
        # every run was paid for, so the receipt keeps their sum.
        before = effect.usage
        try:
            value = call_fn(effect.args["request"])  # a fresh copy: call_fn may change it
        except Exception as exc:
            failure = unanswered(before, exc)
            if failure is exc:
                raise
            raise failure from exc
        if inspect.isawaitable(value):
            return await awaited(before, value)
        return answered(before, value)

    threads = Threads() if sync_call else None

    def sync_handler(effect: Effect) -> object:
        """A plain ``call_fn``'s run, in a worker thread (``sync_handlers="thread"``):
        a blocking SDK call there cannot stop the heartbeats (another worker
        would take the call over and pay again), and the engine treats it as
        the plain handler it is: a deadline waits for it and records its late
        usage; a cancelled caller leaves it running, and ``gate`` keeps the
        call's room until it ends and books what it used (``Threads``)."""
        assert threads is not None
        if not threads.start():
            raise RuntimeError(
                f"model call {call.tool} was settled (its caller left) before its thread "
                "started; the provider was not called"
            )
        used: Usage | None = None
        try:
            before = effect.usage
            try:
                value = call_fn(effect.args["request"])
            except Exception as exc:
                used = before
                failure = unanswered(before, exc)
                if failure is exc:
                    raise
                raise failure from exc
            if inspect.isawaitable(value):
                return awaited(before, value)  # awaited on the loop, as an async call
            try:
                done = answered(before, value)
            except FailedWithUsage as exc:
                used = exc.usage
                raise
            used = done.usage
            return done
        finally:
            threads.end(None if used is None else _spend(used))

    # A provider error is no answer: the turn's next call asks the model again.
    options = replace(run_options or RunOptions(), retryable=provider_error)

    async def run() -> object:
        if not sync_call:
            return await ledger.run(call, handler, options)
        # A plain call_fn always runs in a worker thread, whatever the defaults say.
        return await ledger.run(call, sync_handler, replace(options, sync_handlers="thread"))

    if scopes:
        estimate_spend = Spend(
            usd_to_micros(expected_usd, field="estimate"),
            expected.input_tokens,
            expected.output_tokens,
            0,
        )
        await gate(
            ledger,
            scopes,
            idem_key=idem_key,
            tool=call.tool,
            estimate=estimate_spend,
            units=LLM_UNITS,
            charge=llm_charge,
            run=run,
            hold_ttl_ms=hold_ttl_ms,
            threads=threads,
        )
    else:
        await run()
    effect = await ledger.find_by_idem_key(idem_key)
    if effect is None:
        # Inside ledger.replay() the receipt is the recording's, not the store's.
        answering = recording()
        if answering is not None and answering.ledger is ledger:
            effect = await answering.recorded(idem_key)
    if effect is None:  # it was just run or replayed: only a purge in between removes it
        raise EffectLedgerInvariantError(f"model call {idem_key[:12]}… vanished after it ran")
    return LLMReply(response=effect.result, usage=effect.usage, effect=effect)
