"""``EffectLedger``: the one object applications hold.

A facade: each method checks its arguments' shape and hands over to the
part that does the work. The run engine (:mod:`agent_ledger.engine`) runs
effects; :mod:`agent_ledger.decisions` records people's decisions;
:mod:`agent_ledger.audit` reads the ledger. Atomicity lives in the store.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, overload

from agent_ledger.audit import Audit, EffectPage
from agent_ledger.background import BackgroundLoop, LoopClosing, run_blocking
from agent_ledger.calls import ToolCall
from agent_ledger.decisions import NO_RESULT, Decisions
from agent_ledger.effects import BeginResult, CommitOutcome, Effect, EffectError, JSONValue
from agent_ledger.engine import Acquired, Engine, Prepared
from agent_ledger.engine.lifecycle import recorded_outcome
from agent_ledger.errors import (
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    require_str,
)
from agent_ledger.keys import mismatched_args
from agent_ledger.legacy.keys import legacy_mismatched_args
from agent_ledger.observability import span
from agent_ledger.options import EffectLedgerOptions, LedgerHooks, RunOptions
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores.base import Held, LedgerStats, NewEffect, Store

if TYPE_CHECKING:
    from os import PathLike

    from agent_ledger.budgets import Budget, BudgetState
    from agent_ledger.effects import JSONValue, Usage
    from agent_ledger.replay import Replay
    from agent_ledger.retries import RetryPolicy
    from agent_ledger.sagas import Saga, SagaRecovery
    from agent_ledger.tools import LLMReply, LLMResult, Pricing, Tool, ToolDecorator, WorkflowScope

__all__ = ["RECORDING", "EffectLedger", "Recording"]

T = TypeVar("T")
P = ParamSpec("P")


class Recording(Protocol):
    """What answers calls instead of the engine, for one ledger (``ledger.replay()``).

    The replay layer (``agent_ledger.replay``, above this one) puts one in
    ``RECORDING`` for the block it opens. ``run()`` and ``begin()`` ask it,
    after the call is checked and its key made and before anything is
    stored: the engine never knows.
    """

    ledger: EffectLedger

    async def answer(self, new: NewEffect, legacy_key: str | None = None) -> Effect | None:
        """The finished effect to answer ``new`` from; None to run it as usual.

        ``legacy_key``: the call's 0.2.x key (``legacy_keys=True``), which the
        recorded run may have been answered under (an imported effect).
        Raises to refuse the call (``UnrecordedEffectError``) before anything runs.
        """
        ...

    async def recorded(self, idem_key: str) -> Effect | None:
        """The finished effect recorded under ``idem_key``, or None: for layers that read
        an effect's receipt rather than call it (a saga settling a step to undo)."""
        ...


#: The recording answering this context's calls, or None (almost always):
#: reading it is all a call pays for replay. asyncio copies it into tasks
#: started inside the block, as with ``ledger.workflow()``.
RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar(
    "agent_ledger_recording", default=None
)


async def _from_recording(recording: Recording, prepared: Prepared) -> Effect | None:
    """The recorded effect answering a call, checked as the engine checks one it finds:
    a call that differs in its ``validate_keys`` args gets ``EffectPayloadMismatchError``,
    never the outcome of a request it did not make."""
    recorded = await recording.answer(prepared.new, prepared.legacy_key)
    if recorded is not None and prepared.validate_keys is not None:
        if recorded.idem_key == prepared.new.idem_key:
            differ = mismatched_args(
                recorded.args_canonical, prepared.new.args_canonical, prepared.validate_keys
            )
        else:  # answered under its 0.2.x key: compared as the engine compares those
            differ = legacy_mismatched_args(
                recorded.args_canonical, prepared.new.args_canonical, prepared.validate_keys
            )
        if differ:
            raise EffectPayloadMismatchError(recorded, differ)
    return recorded


class EffectLedger:
    """Runs tool calls as effects: at most one execution per idempotency key.

    >>> from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
    >>> ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    """

    def __init__(self, options: EffectLedgerOptions) -> None:
        if not isinstance(options, EffectLedgerOptions):
            raise EffectLedgerValidationError(
                f"EffectLedger takes EffectLedgerOptions, got {type(options).__name__}",
                field="options",
            )
        self._store: Store = options.store
        self._engine = Engine(options)
        self._decisions = Decisions(self._store, self._engine.schema)
        self._audit = Audit(self._store, self._engine.schema)
        self._tools: dict[str, Tool[Any]] = {}
        self._tools_view = MappingProxyType(self._tools)
        #: The event loop the ledger last ran on, and the loop it owns for
        #: sync callers (started by their first call); see ``call_sync``.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: BackgroundLoop | None = None
        self._owns_store = False
        self._background_lock = threading.Lock()
        self._closing = False
        self._store_closed = False

    @property
    def store(self) -> Store:
        return self._store

    @property
    def hooks(self) -> LedgerHooks:
        """The hooks every ``run()`` uses unless given its own (``EffectLedgerOptions.hooks``)."""
        return self._engine.hooks

    # -- tools -------------------------------------------------------------------------
    # Doors into agent_ledger.tools, the layer above this one (imported when
    # used; pyproject's import contract allows exactly this edge).

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
        """
        from agent_ledger.sagas import check_step_settings
        from agent_ledger.tools import define

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
        )
        # The saga layer says what a tool's saga settings may be.
        check_step_settings(name or "<function name>", compensate, compensate_if, failure_scope)
        return decorate

    @property
    def tools(self) -> Mapping[str, Tool[Any]]:
        """The tools registered on this ledger, by name (read-only)."""
        return self._tools_view

    def workflow(self, workflow_id: str, *, budget: Budget | None = None) -> WorkflowScope:
        """A ``with`` / ``async with`` scope: tool calls inside belong to ``workflow_id``.

        Scopes nest (the innermost wins) and reach tasks started inside them.
        With ``budget``, every tool call and ``llm()`` call inside (inner
        scopes' too) reserves its estimate on that budget, stored durably
        under ``workflow_id``, before it runs, and raises
        ``BudgetExceededError`` instead of running when it does not fit; see
        ``docs/budgets.md``. Without ``budget``, the budget stored under
        ``workflow_id`` (by another worker, or earlier) applies if there is
        one: it is read once, on entering the scope.
        """
        from agent_ledger.tools import BudgetScope, WorkflowScope

        scope = WorkflowScope(workflow_id)  # checks the id before the budget
        if budget is None:
            # The budget stored under this id, if any, still applies (read once,
            # on entering): another worker's limit is this one's too.
            scope.budget = BudgetScope.stored(self, workflow_id)
        else:
            scope.budget = BudgetScope(self, workflow_id, budget)
        return scope

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
        from agent_ledger.tools import DEFAULT_HOLD_TTL_MS, call_llm

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
        from agent_ledger.tools import budget_store

        require_str(workflow_id, "workflow_id")
        return await budget_store(self).get_budget(workflow_id)

    # -- replay ------------------------------------------------------------------------
    # A door into agent_ledger.replay, beside sagas above tools (imported when used).

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
        from agent_ledger.replay import Replay

        return Replay(self, workflow_id, source, strict=strict)

    # -- sagas -------------------------------------------------------------------------
    # A door into agent_ledger.sagas, the layer above tools (imported when used).

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
        from agent_ledger.sagas import Saga

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
        from agent_ledger.sagas import run_saga

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
        from agent_ledger.sagas import recover_sagas

        return await recover_sagas(self, owner=owner, lease_ms=lease_ms, limit=limit)

    # -- running effects ---------------------------------------------------------

    @overload
    async def run(
        self,
        call: ToolCall,
        handler: Callable[[Effect], Awaitable[T]],
        run_options: RunOptions | None = None,
        *,
        hooks: LedgerHooks | None = None,
        tx: object | None = None,
    ) -> T: ...

    @overload
    async def run(
        self,
        call: ToolCall,
        handler: Callable[[Effect], T],
        run_options: RunOptions | None = None,
        *,
        hooks: LedgerHooks | None = None,
        tx: object | None = None,
    ) -> T: ...

    async def run(
        self,
        call: ToolCall,
        handler: Callable[[Effect], object],
        run_options: RunOptions | None = None,
        *,
        hooks: LedgerHooks | None = None,
        tx: object | None = None,
    ) -> object:
        """Run ``handler`` for ``call`` at most once per idempotency key.

        * fresh call: runs ``handler(effect)`` (sync or async) and records
          its return value, which must be JSON;
        * the effect already succeeded: returns the recorded result, no call;
        * it failed: raises ``EffectFailedError`` with the original message
          and code; denied or canceled: raises ``EffectDeniedError``;
        * another caller holds it: waits for that caller's outcome (or takes
          the effect over if its worker stopped heartbeating);
        * approval required: waits for ``approve()``/``deny()``;
        * inside ``ledger.replay()``: answered from the recording, as if
          the recorded effect had been found (see ``replay``).

        If the handler raises, the failure is recorded and the original
        exception re-raised. A non-JSON result is recorded as failed
        (``code="result_not_serializable"``) and raises
        ``EffectLedgerValidationError``. If this run's task is cancelled
        while the handler runs, the effect is recorded ``canceled`` before
        the cancellation propagates. If another attempt committed first,
        the winner's outcome is returned instead of this one's.

        The fresh path returns the handler's own value; replays and waiters
        get the recorded JSON decoded (a tuple comes back as a list).
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._enter(loop)
        prepared = self._engine.prepare(call, run_options, hooks)
        recording = RECORDING.get()
        if recording is not None and recording.ledger is self:
            recorded = await _from_recording(recording, prepared)
            if recorded is not None:
                # Shared: one recorded result answers every call with its key.
                return recorded_outcome(Acquired(recorded, owned=False, shared=True))
        with span("agent_ledger.run", call.tool, prepared.new.idem_key):
            return await self._engine.run(prepared, handler, tx, loop)

    async def begin(
        self,
        call: ToolCall,
        *,
        tx: object | None = None,
        run_options: RunOptions | None = None,
        hooks: LedgerHooks | None = None,
    ) -> BeginResult[object]:
        """``run()`` without the handler: get the effect to execute, or its outcome.

        Returns ``cached=True`` with ``cached_result`` when the effect already
        succeeded. Otherwise the caller owns the returned ``processing``
        effect and must execute the tool and ``commit()`` (pass
        ``attempt=result.effect.attempt`` so a late commit is fenced off),
        heartbeating with ``heartbeat()`` if it takes longer than the stale
        window. Waits like ``run()`` while another caller holds the effect or
        approval is pending; raises ``EffectFailedError`` or
        ``EffectDeniedError`` for recorded failures and decisions.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._enter(loop)
        prepared = self._engine.prepare(call, run_options, hooks)
        recording = RECORDING.get()
        if recording is not None and recording.ledger is self:
            recorded = await _from_recording(recording, prepared)
            if recorded is not None:
                outcome = recorded_outcome(Acquired(recorded, owned=False, shared=True))
                return BeginResult(
                    recorded, cached=True, idempotency_status="replayed", cached_result=outcome
                )
        return await self._engine.begin(prepared, tx)

    async def commit(
        self,
        effect_id: str,
        outcome: CommitOutcome,
        *,
        attempt: int | None = None,
        tx: object | None = None,
    ) -> bool:
        """Record the outcome of an effect obtained from ``begin()``.

        Returns True if this commit recorded the outcome, False if the effect
        was no longer ``processing`` (already committed: first commit wins)
        or, with ``attempt``, had been taken over by a later attempt. A
        result that is not JSON raises ``EffectLedgerValidationError`` and
        records nothing, so the caller can commit again.
        """
        return await self._engine.commit(effect_id, outcome, attempt=attempt, tx=tx)

    async def heartbeat(self, effect_id: str, attempt: int) -> bool:
        """Show that the worker holding ``attempt`` is alive (for begin/commit workers).

        Returns False when the worker no longer holds the effect: stop, and
        do not expect ``commit()`` to be accepted.
        """
        require_str(effect_id, "effect_id")
        await self._engine.schema.ensure()
        held = Held(effect_id, attempt)
        outcome = await self._store.heartbeat((held,))
        # Busy (its row locked by another transaction just now) is still held.
        return held in outcome.refreshed or held in outcome.busy

    # -- sync callers ---------------------------------------------------------------

    def _enter(self, loop: asyncio.AbstractEventLoop) -> None:
        """Note the loop a run starts on; refuse a second loop beside the background one.

        A ledger driven from sync code keeps its store on its background
        loop (a PostgreSQL pool, the waiters' notifications belong to the
        loop that made them), so async code on another loop must not use it
        meanwhile.
        """
        background = self._background
        if background is not None and background.running and loop is not background.loop:
            raise EffectLedgerValidationError(
                "this ledger is being driven from sync code (tool.sync(), run_sync()), so "
                "its store lives on the ledger's background event loop; it cannot also run "
                "on another event loop. Use one ledger per side, or call close_sync() first.",
                field="loop",
            )
        self._loop = loop

    def _blocking_loop(self, what: str) -> asyncio.AbstractEventLoop:
        """The loop a sync call runs on, refusing a caller that is on an event loop itself."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise EffectLedgerValidationError(
                f"{what} blocks until the call is done, and it was called on a running event "
                "loop, which it would stall (heartbeats included). From async code, await "
                "the tool (or ledger.run()) instead.",
                field="loop",
            )
        with self._background_lock:  # two threads' first calls start one loop
            if self._closing or self._store_closed:
                raise EffectLedgerValidationError(
                    "this ledger was closed with close_sync()"
                    + (
                        " and its store with it: open a new ledger"
                        if self._store_closed
                        else " while this call started: call again once close_sync() returned"
                    ),
                    field="ledger",
                )
            home = self._loop
            background = self._background
            if background is not None and background.running:
                return background.loop
            if home is not None and home.is_running() and not home.is_closed():
                # Async code is driving this ledger on another thread (a sync
                # tool, running in a worker thread, calls another tool): run
                # there, where the store lives.
                return home
            self._background = BackgroundLoop(name="agent-ledger-sync")
            return self._background.loop

    def call_sync(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call an async ledger method (or any coroutine function) from sync code.

        ``ledger.call_sync(ledger.approve, key, by="ops")`` runs the
        coroutine on the loop this ledger runs on and blocks until it is
        done. From plain sync code that is a background event loop the
        ledger starts on first use, on a daemon thread, and owns until
        ``close_sync()``; from a worker thread of a ledger that async code
        is driving (a sync tool calling another tool) it is that code's
        loop. Context variables (the ``ledger.workflow()`` scope) come
        along. Called on a running event loop it raises instead of
        blocking that loop. See ``docs/tools.md`` for the cost.
        """
        return self._block(getattr(fn, "__qualname__", "call_sync"), fn, *args, **kwargs)

    @overload
    def run_sync(
        self,
        call: ToolCall,
        handler: Callable[[Effect], Awaitable[T]],
        run_options: RunOptions | None = None,
        *,
        hooks: LedgerHooks | None = None,
    ) -> T: ...

    @overload
    def run_sync(
        self,
        call: ToolCall,
        handler: Callable[[Effect], T],
        run_options: RunOptions | None = None,
        *,
        hooks: LedgerHooks | None = None,
    ) -> T: ...

    def run_sync(
        self,
        call: ToolCall,
        handler: Callable[[Effect], object],
        run_options: RunOptions | None = None,
        *,
        hooks: LedgerHooks | None = None,
    ) -> object:
        """``run()`` for sync callers: blocks until the effect's outcome (see ``call_sync``)."""
        return self._block("run_sync()", self.run, call, handler, run_options, hooks=hooks)

    def _block(
        self, what: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        loop = self._blocking_loop(what)
        context = contextvars.copy_context()
        background = self._background
        if background is not None and loop is background.loop:
            try:
                return background.run(fn(*args, **kwargs), context)
            except LoopClosing:
                raise EffectLedgerValidationError(
                    "this ledger is being closed (close_sync(), or the interpreter is "
                    "exiting); the call was not started",
                    field="ledger",
                ) from None
        return run_blocking(loop, fn(*args, **kwargs), context)

    def close_sync(self, *, timeout_s: float = 10.0) -> None:
        """Stop the background loop sync calls use: calls still running there are
        cancelled (their effects recorded ``canceled``, their callers get
        ``CancelledError``), then the store is closed if the ledger opened it
        (``agent_ledger.sync.open_ledger``), then the loop's thread ends.
        Idempotent; a no-op for a ledger only ever used from async code.
        Sync calls made while it closes raise ``EffectLedgerValidationError``;
        after it, a ledger whose store it closed refuses them, and any other
        starts a new loop on the next one."""
        with self._background_lock:
            background = self._background
            if background is None or not background.running or self._closing:
                return
            self._closing = True  # no sync call is routed anywhere meanwhile
        try:
            # Calls still running end first (recording their effects
            # canceled), while the store is open; none can start after.
            background.drain()
            if self._owns_store:
                self._store_closed = True
                background.run_closing(self._store.close())
        finally:
            background.stop(timeout_s)
            with self._background_lock:
                self._background = None
                if self._loop is background.loop:
                    self._loop = None
                self._closing = False

    def _adopt_background(self, background: BackgroundLoop, *, owns_store: bool) -> None:
        """Use ``background`` for sync calls: the store was opened on it (``agent_ledger.sync``)."""
        self._background = background
        self._loop = background.loop
        self._owns_store = owns_store

    # -- decisions -------------------------------------------------------------------

    async def request_approval(self, idem_key: str) -> bool:
        """Take an approval back: ``ready`` -> ``requires_approval``; True if it moved.

        Only an approved effect that nobody has claimed yet can be sent back
        for another look; every other status returns False. A ``processing``
        effect in particular is refused: its handler is already running, so
        an approval could not stop it, and it would only make the running
        handler's commit fail and the handler run again after the approval.
        To have a call wait for a person before it runs, create it that way:
        ``RunOptions(requires_approval=True)`` or the ``requires_approval``
        policy hook. The ``on_approval_required`` hook is called when it moved.
        """
        return await self._decisions.request_approval(idem_key, self._engine.hooks)

    async def approve(
        self,
        idem_key: str,
        *,
        by: str | None = None,
        note: str | None = None,
        expected_attempt: int | None = None,
    ) -> bool:
        """Approve a pending effect (``requires_approval`` -> ``ready``); True if it moved.

        ``by`` and ``note`` are kept on the receipt and in its history. A
        waiting ``run()`` then claims the effect and runs the handler. For a
        parked effect (an ambiguous attempt) approving says "I checked: it did
        not happen, run it again". ``expected_attempt`` (the ``attempt`` you
        saw) makes it a compare-and-set on that attempt too: False, changing
        nothing, if the effect has moved on since.
        """
        return await self._decisions.approve(
            idem_key, by=by, note=note, expected_attempt=expected_attempt
        )

    async def deny(
        self,
        idem_key: str,
        *,
        reason: str | None = None,
        by: str | None = None,
        expected_attempt: int | None = None,
    ) -> bool:
        """Deny a pending effect (-> ``denied``, terminal); True if it moved.

        Callers get ``EffectDeniedError`` with the reason. ``expected_attempt``
        as for :meth:`approve`.
        """
        return await self._decisions.deny(
            idem_key, reason=reason, by=by, expected_attempt=expected_attempt
        )

    async def resolve(
        self,
        idem_key: str,
        *,
        result: JSONValue = NO_RESULT,
        error: EffectError | None = None,
        by: str,
        note: str | None = None,
        expected_attempt: int | None = None,
    ) -> bool:
        """Settle a parked effect with the outcome you read downstream; True if it moved.

        For an effect parked because its worker went silent after its
        handler started (``on_stale="park"``, error code
        ``ambiguous_attempt``): ``result=`` says "it did happen, here is what
        the provider says" and records ``succeeded`` with that result (every
        waiting and later caller gets it, as a replay); ``error=EffectError(...)``
        records ``failed``. Exactly one of the two; ``result`` must be JSON,
        like a handler's (bad input raises ``EffectLedgerValidationError``
        and changes nothing). ``by`` (required) and ``note`` go on the
        receipt and into its history. ``expected_attempt`` as for
        :meth:`approve`. An effect waiting for an ordinary approval (its
        handler never ran) raises ``EffectLedgerValidationError``: approve
        or deny it. False means nothing changed: no such key, not waiting,
        another attempt, or someone settled it first.
        """
        return await self._decisions.resolve(
            idem_key,
            result=result,
            error=error,
            by=by,
            note=note,
            expected_attempt=expected_attempt,
        )

    async def park_stale(self) -> list[Effect]:
        """Park every ambiguous attempt now, without waiting for its next caller.

        An effect whose holder went silent for its lease after its handler
        started under ``on_stale="park"`` is moved, one fenced statement
        each, to ``requires_approval`` (error code ``ambiguous_attempt``), as
        its next caller would move it; returns those this call parked.
        Staleness is judged by each holder's own lease alone (``lease_ms``,
        by the store's clock): the holder promised to heartbeat within it.
        The ``on_approval_required`` hook is called for each one parked.
        From a shell: ``agent-ledger park-stale``.
        """
        return await self._decisions.park_stale(self._engine.hooks)

    async def cancel(
        self, idem_key: str, *, reason: str | None = None, by: str | None = None
    ) -> bool:
        """Cancel a non-terminal effect (-> ``canceled``, terminal); True if it moved.

        A handler already running is not interrupted, but its commit will be
        rejected and callers get ``EffectDeniedError``.
        """
        return await self._decisions.cancel(idem_key, reason=reason, by=by)

    def approval_policy(
        self, run_options: RunOptions | None = None, *, hooks: LedgerHooks | None = None
    ) -> bool | Callable[[ToolCall], bool]:
        """Which fresh calls ``run(call, run_options, hooks=hooks)`` makes wait for a person.

        ``True``: every call (``RunOptions.requires_approval`` over the
        ledger's defaults); ``False``: none; otherwise the ``requires_approval``
        hook, a function of the ``ToolCall`` that ``run()`` asks for each
        fresh call. Nothing is stored. It speaks only of effects a call would
        create: one that exists keeps its own status (``find_by_idem_key``).
        For callers that pause their own way and want to know before they
        call (an agent framework's approval step).
        """
        return self._engine.approval_policy(run_options, hooks)

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> bool:
        """Send a failed or canceled effect back to run again (-> ``ready``); True if it moved.

        For an operator who fixed what made it fail (a bug in the tool, an
        outage): the next call with its key claims it and runs the handler
        once, counting tries afresh. How it had ended (status, error, tries),
        ``by`` and ``reason`` (both required) are kept in ``history`` and
        shown on the receipt. A handler still running from before a cancel
        stays fenced off: its commit is refused. A succeeded or denied
        effect is never reopened (a result is the receipt; a denial stands):
        that raises ``EffectLedgerValidationError`` saying so. False means
        nothing changed: no such key, the effect has not finished, or
        someone else reopened it first.
        """
        return await self._decisions.reopen(idem_key, by=by, reason=reason)

    # -- audit -----------------------------------------------------------------------------

    async def list_effects(
        self,
        workflow_id: str | None = None,
        tool: str | None = None,
        status: EffectStatus | str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        *,
        call_id: str | None = None,
        error_code: str | None = None,
        min_duration: timedelta | None = None,
        max_duration: timedelta | None = None,
    ) -> EffectPage:
        """Effects matching every given filter, newest first, a page at a time.

        Pass the returned ``next_cursor`` back as ``cursor`` for the next
        page; pagination is by position (``created_at``, ``id``), so effects
        created meanwhile never shift or repeat a page. ``since`` is
        inclusive and ``until`` exclusive, on ``created_at``. ``call_id`` and
        ``error_code`` match exactly. ``min_duration`` and ``max_duration``
        (both inclusive) bound the *handler time*, ``effects.handler_time``:
        the current run from its start to its recorded outcome (or to now,
        while it runs), never the wait for a person; effects with no known
        handler time (no handler ran yet, or a person canceled the run
        midway) never match them.
        """
        return await self._audit.list_effects(
            workflow_id=workflow_id,
            tool=tool,
            status=status,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
            call_id=call_id,
            error_code=error_code,
            min_duration=min_duration,
            max_duration=max_duration,
        )

    async def pending_approvals(self, limit: int = 100) -> list[Effect]:
        """Effects waiting for a human, newest first."""
        page = await self.list_effects(status=EffectStatus.REQUIRES_APPROVAL, limit=limit)
        return page.effects

    async def stats(self) -> LedgerStats:
        """Counts by status and by tool, and how many calls were duplicates."""
        return await self._audit.stats()

    async def purge(
        self, older_than: timedelta, statuses: Iterable[EffectStatus | str] = TERMINAL
    ) -> int:
        """Delete terminal effects completed at least ``older_than`` ago; return how many.

        Never removes an effect that could still change: asking for a
        non-terminal status raises ``EffectLedgerValidationError``.
        """
        return await self._audit.purge(older_than, statuses)

    async def get_effect(self, effect_id: str) -> Effect | None:
        """The effect with this id, or None."""
        return await self._audit.get_effect(effect_id)

    async def find_by_idem_key(self, idem_key: str) -> Effect | None:
        """The effect with this idempotency key, or None."""
        return await self._audit.find_by_idem_key(idem_key)

    async def lookup(self, ref: str) -> Effect | None:
        """The effect ``ref`` names: its id, its idempotency key, or a unique prefix
        of the key (at least 8 hex characters), as people copy them from a listing.

        Returns None when nothing matches; a prefix that matches several
        effects raises ``EffectLedgerValidationError`` listing how to narrow it.
        """
        return await self._audit.lookup(ref)

    def idem_key(self, call: ToolCall) -> str:
        """The idempotency key ``run(call, ...)`` would use (see ``agent_ledger.keys``)."""
        return self._engine.idem_key(call)
