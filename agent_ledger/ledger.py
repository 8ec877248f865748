"""``EffectLedger``: the one object applications hold.

A facade on top of the layers: ``LedgerCore`` (:mod:`agent_ledger.core`)
runs calls, records decisions and reads the ledger; this class adds the
layers built on it, each a door of one method: tools and workflows
(:mod:`agent_ledger.tools`), model calls and budgets (the same), sagas
(:mod:`agent_ledger.sagas`) and replay (:mod:`agent_ledger.replay`). Those
layers know only the core, never this class, so the imports below all point
down. Atomicity lives in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from os import PathLike
from typing import Any, Literal

from agent_ledger.budgets import Budget, BudgetState
from agent_ledger.calls import Scope, ToolCall
from agent_ledger.context import RECORDING as RECORDING  # kept importable here (0.3.x)
from agent_ledger.context import Recording as Recording  # kept importable here (0.3.x)
from agent_ledger.core import LedgerCore
from agent_ledger.effects import JSONValue, Usage
from agent_ledger.errors import require_str
from agent_ledger.options import RunOptions
from agent_ledger.replay import Replay
from agent_ledger.retries import Retryable, RetryPolicy
from agent_ledger.sagas import Saga, SagaRecovery, check_step_settings, recover_sagas, run_saga
from agent_ledger.stores.base import Store
from agent_ledger.tools import (
    DEFAULT_HOLD_TTL_MS,
    LLMReply,
    LLMResult,
    Pricing,
    Tool,
    ToolDecorator,
    WorkflowScope,
    budget_store,
    call_llm,
    define,
    workflow_scope,
)

__all__ = ["RECORDING", "EffectLedger", "Recording"]


class EffectLedger(LedgerCore[Tool[Any]]):
    """Runs tool calls as effects: at most one execution per idempotency key.

    ``run()``, ``begin()``/``commit()``, the decisions and the audit come
    from ``LedgerCore``; this class adds tools, workflows and model calls,
    sagas and replay.

    >>> from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
    >>> ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    """

    # -- tools (agent_ledger.tools) ------------------------------------------------------

    def tool(
        self,
        name: str | None = None,
        *,
        idempotency_keys: Sequence[str] | None = None,
        validate_keys: Sequence[str] | Literal["all"] | None = None,
        requires_approval: bool | Callable[[ToolCall], bool] | None = None,
        workflow_id: str | None = None,
        run_options: RunOptions | None = None,
        retry: RetryPolicy | None = None,
        timeout_ms: int | None = None,
        compensate: str | None = None,
        compensate_if: Literal["succeeded", "attempted"] = "succeeded",
        failure_scope: Literal["saga", "step"] = "saga",
        on_stale: Literal["take_over", "park"] | None = None,
        scope: Scope | None = None,
        retryable: Retryable | None = None,
    ) -> ToolDecorator:
        """Register a function as a tool: ``@ledger.tool("payments.charge", ...)``.

        Each ``await tool(...)`` runs the function through ``run()`` once per
        (workflow, tool name, key args); see ``docs/tools.md``. ``name``
        defaults to ``module.qualname`` of the function; a name already
        registered on this ledger raises. ``idempotency_keys`` and
        ``validate_keys`` name parameters (as in ``ToolCall``);
        ``requires_approval`` is a bool (``RunOptions.requires_approval``) or
        a function of the ``ToolCall`` asked beside the ledger's policy hook;
        ``workflow_id`` pins the tool to one workflow, else the call's
        ``ledger.workflow(...)`` scope decides. ``retry`` is the tool's
        ``RunOptions.retry``: its failures are retried by that policy, and
        ``timeout_ms`` its ``RunOptions.timeout_ms``: the handler's deadline.
        ``compensate`` names the tool that undoes a call inside a saga,
        ``compensate_if`` whether a failed call is undone too ("attempted"),
        and ``failure_scope`` whether its failure rolls the saga back
        ("saga") or is recorded and the saga goes on ("step"); see
        ``docs/sagas.md``. ``on_stale`` is the tool's ``RunOptions.on_stale``:
        ``"park"`` for a side effect that must never repeat and cannot take an
        idempotency key downstream (``docs/choosing-recovery.md``).
        ``scope`` says what else makes two calls the same call: ``"workflow"``
        (nothing: the default for a tool that declares none), ``"turn"`` (the
        turn of ``ledger.workflow(id, turn=...)``) or ``"call"`` (the
        framework's tool-call id); see ``docs/concepts.md``. ``retryable`` is
        the tool's ``RunOptions.retryable``: the failures (exception types, or
        a predicate) a later call runs again instead of replaying them.
        """

        decorate = define(
            self,
            self._tools,
            name,
            idempotency_keys=idempotency_keys,
            validate_keys=validate_keys,
            requires_approval=requires_approval,
            workflow_id=workflow_id,
            run_options=run_options,
            retry=retry,
            timeout_ms=timeout_ms,
            compensate=compensate,
            compensate_if=compensate_if,
            failure_scope=failure_scope,
            on_stale=on_stale,
            scope=scope,
            retryable=retryable,
        )
        # The saga layer says what a tool's saga settings may be.
        check_step_settings(name or "<function name>", compensate, compensate_if, failure_scope)
        return decorate

    def workflow(
        self, workflow_id: str, *, budget: Budget | None = None, turn: str | None = None
    ) -> WorkflowScope:
        """A ``with`` / ``async with`` scope: tool calls inside belong to ``workflow_id``.

        ``turn`` names the current turn of that workflow (one user request, a
        framework's run): tools with ``scope="turn"`` are keyed by it, so the
        same arguments in a later turn run again, and every effect created
        inside records it (``Effect.turn``), so a later turn answered from
        its receipt can say so (``Tool.call_outcome``). An inner scope without
        ``turn`` has none.

        Scopes nest (the innermost wins) and reach tasks started inside them.
        With ``budget``, every tool call and ``llm()`` call inside (inner
        scopes' too) reserves its estimate on that budget, stored durably
        under ``workflow_id``, before it runs, and raises
        ``BudgetExceededError`` instead of running when it does not fit; see
        ``docs/budgets.md``. Without ``budget``, the budget stored under
        ``workflow_id`` (by another worker, or earlier) applies if there is
        one: it is read once, on entering the scope.
        """
        return workflow_scope(self, workflow_id, budget, turn)

    async def llm(
        self,
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
        hold_ttl_ms: int | None = None,
    ) -> LLMReply:
        """A model call as an effect: ``call_fn(request)`` runs at most once per
        (workflow, provider, model, request), and its response and usage are
        recorded on the effect.

        ``call_fn`` (sync or async) gets a copy of ``request`` and returns an
        ``LLMResult(response, usage)``, or anything ``read`` turns into one
        (the adapters' ``llm_result`` reads the SDKs' responses). ``pricing``,
        ``(provider, model, usage) -> USD``, prices the usage (asked once on
        ``estimate`` before anything runs, so a broken callback fails early);
        a dollar budget needs it. ``estimate`` is the usage to reserve under
        a budget (default: none, which still stops at an exhausted limit).
        Returns the recorded response and usage with the receipt, the same on
        a replay. See ``docs/budgets.md``.
        """

        return await call_llm(
            self,
            call_fn,
            provider=provider,
            model=model,
            request=request,
            pricing=pricing,
            estimate=estimate,
            read=read,
            workflow_id=workflow_id,
            run_options=run_options,
            hold_ttl_ms=DEFAULT_HOLD_TTL_MS if hold_ttl_ms is None else hold_ttl_ms,
        )

    async def budget(self, workflow_id: str) -> BudgetState | None:
        """The budget stored for ``workflow_id`` (limits, spent, reserved), or None."""

        require_str(workflow_id, "workflow_id")
        return await budget_store(self).get_budget(workflow_id)

    # -- replay (agent_ledger.replay) ---------------------------------------------------

    def replay(
        self,
        workflow_id: str,
        *,
        source: Store | str | PathLike[str],
        strict: bool = True,
    ) -> Replay:
        """``async with ledger.replay("wf-7", source="wf-7.jsonl"):`` re-runs a recorded workflow.

        Inside the block (``with`` or ``async with``, which also makes it
        ``ledger.workflow(workflow_id)``), every call this ledger gets is
        answered from the recording by its idempotency key, never by
        position: a recorded result is returned, a recorded failure or
        denial raised as a replay raises it, and no handler runs. ``source``
        is a store holding the run (only read: nothing in it changes) or the
        path of ``agent-ledger export --workflow W --format jsonl`` output,
        and must not be this ledger's own store. A call the recording cannot
        answer raises ``UnrecordedEffectError`` before anything runs, or with
        ``strict=False`` runs on this ledger's store and is logged. See
        ``docs/replay.md``.
        """

        return Replay(self, workflow_id, source, strict=strict)

    # -- sagas (agent_ledger.sagas) -----------------------------------------------------

    def saga(
        self,
        saga_id: str,
        *,
        lease_ms: int | None = None,
        abandon_after: timedelta | None = None,
        on_compensation_failure: Literal["continue", "stop"] = "continue",
        owner: str | None = None,
        budget: Budget | None = None,
    ) -> Saga:
        """``async with ledger.saga("order-42") as saga:``: tool calls inside are steps.

        A step that fails (or a cancelled task) undoes the completed steps in
        reverse order, with each tool's ``compensate`` tool, and raises
        ``SagaFailed`` (``SagaCompensationFailed`` if an undo kept failing).
        ``saga_id`` is also the block's workflow id. Re-running an id replays
        its steps from their receipts. ``lease_ms`` is how long the owner may
        go without a heartbeat before another worker takes the saga over;
        ``abandon_after`` lets ``recover_sagas()`` roll back a saga left
        running that long (default: never, it is listed for a person);
        ``on_compensation_failure="stop"`` stops undoing at the first
        compensation that keeps failing. ``budget`` limits the steps' (and
        model calls') spend as ``workflow(saga_id, budget=...)`` does;
        compensations are never refused for lack of budget. See
        ``docs/sagas.md`` and ``docs/budgets.md``.
        """

        return Saga(
            self,
            saga_id,
            lease_ms=lease_ms,
            abandon_after=abandon_after,
            on_compensation_failure=on_compensation_failure,
            owner=owner,
            budget=budget,
        )

    async def run_saga(
        self,
        saga_id: str,
        plan: Sequence[object],
        *,
        lease_ms: int | None = None,
        abandon_after: timedelta | None = None,
        on_compensation_failure: Literal["continue", "stop"] = "continue",
        owner: str | None = None,
    ) -> list[object]:
        """Run a saga a model planned: ``[{"tool": name, "args": {...}}, [...], ...]``.

        Each item is a step; a nested list is a parallel group. Tools are
        looked up by name among this ledger's. The plan is checked whole
        before anything is stored or run. Returns the results in the plan's
        shape; raises like ``async with ledger.saga(...)`` (``SagaFailed``...).
        """

        return await run_saga(
            self,
            saga_id,
            plan,
            lease_ms=lease_ms,
            abandon_after=abandon_after,
            on_compensation_failure=on_compensation_failure,
            owner=owner,
        )

    async def recover_sagas(
        self, *, owner: str | None = None, lease_ms: int | None = None, limit: int = 100
    ) -> SagaRecovery:
        """Finish the sagas whose owners are gone; what this pass did.

        Claims each saga whose owner's lease ran out: one that was
        compensating is finished from its stored steps and this ledger's
        tools; one still running forward is rolled back once it has been left
        longer than its ``abandon_after``, and is otherwise left for its code
        to be re-run (listed in ``running``). Safe to run from several
        processes at once: each saga is claimed by one, each undo runs once.
        """

        return await recover_sagas(self, owner=owner, lease_ms=lease_ms, limit=limit)
