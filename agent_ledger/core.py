"""``LedgerCore``: effects run once, people decide, the ledger is read. Nothing else.

The core of the ledger, below the layers that build on it: it runs calls
(``run``, ``begin``/``commit``/``heartbeat``) through the engine
(:mod:`agent_ledger.engine`), records people's decisions
(:mod:`agent_ledger.decisions`), reads the ledger (:mod:`agent_ledger.audit`),
and keeps the hooks, the tool registry and the event loop its calls run on.
Each method checks its arguments' shape and hands over; atomicity lives in
the store.

It knows nothing of tools, sagas or replay: they are layers above
(:mod:`agent_ledger.tools`, :mod:`agent_ledger.sagas`,
:mod:`agent_ledger.replay`) that use this class, and
:class:`agent_ledger.ledger.EffectLedger`, the facade applications hold,
composes them on top of it. Two things let them in without this module
naming them: the tool registry, which keeps whatever the tools layer
registers (``ToolT_co``) by name, and the recording a replay enters in the
context (:func:`agent_ledger.context.recording`), which ``run()`` and
``begin()`` ask before the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Generic, ParamSpec, TypeVar, overload

from agent_ledger.approvals import Channel, DecisionAction
from agent_ledger.audit import Audit, EffectPage
from agent_ledger.background import BackgroundLoop, HomeLoop
from agent_ledger.calls import Scope, ToolCall, check_scope
from agent_ledger.context import Recording, current_outcome_slot, recording
from agent_ledger.deciding import ApprovalSweep, decide_in_code, sweep_approvals
from agent_ledger.decisions import NO_RESULT, ApprovalAsk, Decisions, check_decision
from agent_ledger.decisions import expected_attempt as checked_attempt
from agent_ledger.effects import BeginResult, CommitOutcome, Effect, EffectError, JSONValue
from agent_ledger.engine import Acquired, Engine, Prepared
from agent_ledger.engine.lifecycle import recorded_outcome
from agent_ledger.errors import (
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    require_str,
)
from agent_ledger.keys import canonical_json, mismatched_args
from agent_ledger.legacy.keys import legacy_mismatched_args
from agent_ledger.observability import span, tracing
from agent_ledger.options import EffectLedgerOptions, LedgerHooks, RunOptions
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores.base import Held, LedgerStats, Store

__all__ = ["UNNAMED", "LedgerCore"]

#: The principal the audit trail names for a decision made in code without ``by``.
UNNAMED = "unnamed"

T = TypeVar("T")
P = ParamSpec("P")
#: What the tools layer registers (``agent_ledger.tools.Tool``); the core only
#: keeps it by name. Covariant: a ledger of tools is a ledger of anything.
ToolT_co = TypeVar("ToolT_co", covariant=True)


def _rescoped(call: ToolCall, scope: Scope | None, call_id: str | None) -> ToolCall:
    """``call`` with ``ledger.run``'s ``scope`` and ``call_id`` (checked as a ToolCall's)."""
    if not isinstance(call, ToolCall):
        return call  # the engine names the problem
    changes: dict[str, object] = {}
    if scope is not None:
        changes["scope"] = check_scope(scope)
    if call_id is not None:
        changes["call_id"] = call_id
    return dataclasses.replace(call, **changes)  # type: ignore[arg-type]


async def _from_recording(answering: Recording, prepared: Prepared) -> Effect | None:
    """The recorded effect answering a call, checked as the engine checks one it finds:
    a call that differs in its ``validate_keys`` args gets ``EffectPayloadMismatchError``,
    never the outcome of a request it did not make."""
    recorded = await answering.answer(prepared.new, prepared.legacy_key)
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


class LedgerCore(Generic[ToolT_co]):
    """Runs calls as effects, records decisions, reads the ledger: the core of ``EffectLedger``.

    Applications hold an ``EffectLedger`` (this, with tools, sagas and
    replay on top); layers above this one type against ``LedgerCore``.
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
        #: The tools registered on this ledger, by name (``EffectLedger.tool()``).
        self._tools: dict[str, ToolT_co] = {}
        self._tools_view = MappingProxyType(self._tools)
        #: The event loop the ledger runs on, and the one it owns for sync callers.
        self._home = HomeLoop()

    @property
    def store(self) -> Store:
        return self._store

    @property
    def hooks(self) -> LedgerHooks:
        """The hooks every ``run()`` uses unless given its own (``EffectLedgerOptions.hooks``)."""
        return self._engine.hooks

    @property
    def tools(self) -> Mapping[str, ToolT_co]:
        """The tools registered on this ledger, by name (read-only)."""
        return self._tools_view

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
        scope: Scope | None = None,
        call_id: str | None = None,
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
        scope: Scope | None = None,
        call_id: str | None = None,
    ) -> T: ...

    async def run(
        self,
        call: ToolCall,
        handler: Callable[[Effect], object],
        run_options: RunOptions | None = None,
        *,
        hooks: LedgerHooks | None = None,
        tx: object | None = None,
        scope: Scope | None = None,
        call_id: str | None = None,
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

        ``scope`` and ``call_id``, when given, replace the call's own
        (``ToolCall.scope``, ``ToolCall.call_id``): ``scope="turn"`` keys
        the call by the turn of ``ledger.workflow(id, turn=...)`` too,
        ``scope="call"`` by ``call_id`` (see ``agent_ledger.keys``).
        With ``run_options.retryable``, a failure it names is recorded as
        retryable: the next call with the key runs the handler again.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._home.loop:
            self._home.enter(loop)
        if scope is not None or call_id is not None:
            call = _rescoped(call, scope, call_id)
        prepared = self._engine.prepare(call, run_options, hooks)
        answering = recording()
        if answering is not None and answering.ledger is self:
            recorded = await _from_recording(answering, prepared)
            if recorded is not None:
                slot = current_outcome_slot(prepared.new.idem_key)
                if slot is not None:
                    slot.fill(recorded, replayed=True)
                # Shared: one recorded result answers every call with its key.
                return recorded_outcome(Acquired(recorded, owned=False, shared=True))
        if not tracing():
            return await self._engine.run(prepared, handler, tx, loop)
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
        if loop is not self._home.loop:
            self._home.enter(loop)
        prepared = self._engine.prepare(call, run_options, hooks)
        answering = recording()
        if answering is not None and answering.ledger is self:
            recorded = await _from_recording(answering, prepared)
            if recorded is not None:
                outcome = recorded_outcome(Acquired(recorded, owned=False, shared=True))
                return BeginResult(
                    recorded, cached=True, idempotency_status="replayed", cached_result=outcome
                )
        begun = await self._engine.begin(prepared, tx)
        if not begun.cached and tx is None:
            # The caller holds it now: request_approval(key) is its own step.
            self._decisions.begun.remember(begun.effect)
        return begun

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
        committed = await self._engine.commit(effect_id, outcome, attempt=attempt, tx=tx)
        self._decisions.begun.forget(effect_id)
        return committed

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
        return self._home.call(getattr(fn, "__qualname__", "call_sync"), fn, *args, **kwargs)

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
        return self._home.call("run_sync()", self.run, call, handler, run_options, hooks=hooks)

    def close_sync(self, *, timeout_s: float = 10.0) -> None:
        """Stop the background loop sync calls use: calls still running there are
        cancelled (their effects recorded ``canceled``, their callers get
        ``CancelledError``), then the store is closed if the ledger opened it
        (``agent_ledger.sync.open_ledger``), then the loop's thread ends.
        Idempotent; a no-op for a ledger only ever used from async code.
        Sync calls made while it closes raise ``EffectLedgerValidationError``;
        after it, a ledger whose store it closed refuses them, and any other
        starts a new loop on the next one."""
        self._home.close(self._store.close, timeout_s)

    def _adopt_background(self, background: BackgroundLoop, *, owns_store: bool) -> None:
        """Use ``background`` for sync calls: the store was opened on it (``agent_ledger.sync``)."""
        self._home.adopt(background, owns_store=owns_store)

    # -- decisions -------------------------------------------------------------------

    async def request_approval(self, idem_key: str, *, attempt: int | None = None) -> bool:
        """Send an effect to a person; True if it moved to ``requires_approval``.

        Two callers may: the effect's **holder**, before it runs the tool
        (a ``begin()`` worker that decides the call needs a person: pass
        ``attempt=result.effect.attempt``, or nothing when this ledger's
        ``begin()`` gave it the effect in the same asyncio task), and anyone, for an approved effect
        nobody has claimed yet (``ready``: the approval is taken back). The
        holder's step is fenced by its attempt: nobody can claim the effect
        until a person approves it, then the next call runs it once. A holder
        that was taken over or finished meanwhile gets
        ``EffectLedgerValidationError`` (``field="attempt"``) and must not run
        the tool. Anyone else asking for a ``processing`` effect gets
        ``EffectLedgerValidationError`` (``field="idem_key"``): its handler
        may be running, and an approval could not stop it. Other statuses
        (already waiting, finished, an unknown key) return False. The
        ``on_approval_required`` hook is called when it moved.
        """
        hooks = self._engine.hooks
        ask = ApprovalAsk.of(self._engine.run_options(None), hooks)
        return await self._decisions.request_approval(idem_key, hooks, attempt=attempt, ask=ask)

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

        It goes through the one audited decision path (``deciding.decide``):
        every attempt, accepted or refused, is a row of the decision audit
        trail with ``by`` as its principal (``"unnamed"`` when None; this
        process is trusted to say who it is) and the channel ``code``, bound
        to the intent of the effect it read. False:
        nothing to decide (no such key, not waiting, another attempt, someone
        decided first). An approval whose deadline passed raises
        ``DecisionRefusedError`` (reason ``expired``): the effect is denied.
        """
        return await self._decide(
            DecisionAction.APPROVE,
            idem_key,
            by=by,
            note=note,
            expected_attempt=expected_attempt,
        )

    async def deny(
        self,
        idem_key: str,
        reason: str | None = None,
        *,
        by: str | None = None,
        expected_attempt: int | None = None,
    ) -> bool:
        """Deny a pending effect (-> ``denied``, terminal); True if it moved.

        Callers get ``EffectDeniedError`` with the reason. ``expected_attempt``
        and the audit trail as for :meth:`approve`. ``reason`` may
        be passed by position, as 0.2.x did.
        """
        if reason is not None and not isinstance(reason, str):
            raise EffectLedgerValidationError(
                f"reason must be a string or None, got {type(reason).__name__}", field="reason"
            )
        return await self._decide(
            DecisionAction.DENY,
            idem_key,
            by=by,
            note=reason or None,
            expected_attempt=expected_attempt,
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
        receipt and into its history. ``expected_attempt`` and the audit
        trail as for :meth:`approve`. An effect waiting for an
        ordinary approval (its handler never ran) raises
        ``EffectLedgerValidationError``: approve or deny it. False means
        nothing changed: no such key, not waiting, another attempt, or
        someone settled it first.
        """
        require_str(idem_key, "idem_key")
        if (result is NO_RESULT) == (error is None):
            raise EffectLedgerValidationError(
                "resolve() takes exactly one of result= (the side effect happened: what the "
                "provider reports) or error=EffectError(...) (it failed). Nothing changed.",
                field="result",
            )
        if error is not None and not isinstance(error, EffectError):
            raise EffectLedgerValidationError(
                f"error must be an EffectError(message, code), got {type(error).__name__}",
                field="error",
            )
        if result is not NO_RESULT:
            # Checked like a handler's return value: bad input changes nothing.
            canonical_json(result, field="result", sort_keys=False)
        if not isinstance(by, str) or not by.strip():
            raise EffectLedgerValidationError(
                f"by is required: a non-empty string saying who resolves the effect, got {by!r}",
                field="by",
            )
        return await self._decide(
            DecisionAction.RESOLVE,
            idem_key,
            by=by,
            note=note,
            expected_attempt=expected_attempt,
            result=result,
            error=error,
        )

    async def _decide(
        self,
        action: DecisionAction,
        idem_key: str,
        *,
        by: str | None,
        note: str | None,
        expected_attempt: int | None,
        result: JSONValue = NO_RESULT,
        error: EffectError | None = None,
    ) -> bool:
        require_str(idem_key, "idem_key")
        checked = check_decision(by, note)
        attempt = checked_attempt(expected_attempt)
        await self._engine.schema.ensure()
        return await decide_in_code(
            self._store,
            idem_key,
            action=action,
            principal=checked.by or UNNAMED,
            channel=Channel.CODE,
            decided_by=checked.by,
            note=checked.note,
            expected_attempt=attempt,
            result=result,
            error=error,
        )

    async def sweep_approvals(self) -> ApprovalSweep:
        """Deny, with the code ``expired``, every effect still waiting for an
        approval past its deadline (``RunOptions.approval_deadline_ms``, by the
        store's clock), then fire ``LedgerHooks.on_approval_escalation`` once per
        request that has used ``LedgerHooks.escalate_after`` of its time to its
        deadline. Safe to run from any number of processes at once: each effect is
        denied once, each escalation fires once. Returns what this call did. From
        a shell: ``agent-ledger sweep``; run it every minute or so (cron, a loop).
        A parked effect (an ambiguous attempt) never expires.
        """
        await self._engine.schema.ensure()
        return await sweep_approvals(self._store, self._engine.hooks)

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
