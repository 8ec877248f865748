"""The effect ledger: turns tool calls into effects that run once and leave a receipt.

Policy lives here (what to do with a fresh, duplicate, stale or approved
effect; how to wait; hooks); atomicity lives in the store. ``run()`` is
``begin()`` + the handler + ``commit()``, with the waiting, heartbeating and
fencing that make it safe under retries, crashes and concurrent workers.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, TypeVar, overload

import orjson

from agent_ledger.audit import EffectPage, build_query, encode_cursor
from agent_ledger.calls import ToolCall
from agent_ledger.effects import (
    BeginResult,
    CommitFailed,
    CommitOutcome,
    CommitSucceeded,
    Effect,
    EffectError,
    storable_text,
)
from agent_ledger.errors import (
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerInvariantError,
    EffectLedgerValidationError,
    EffectStoreError,
    EffectTimeoutError,
)
from agent_ledger.heartbeats import Heartbeats
from agent_ledger.keys import DEFAULT_MAX_ARGS_SIZE_BYTES, canonical_json, canonicalize
from agent_ledger.observability import effect_fields, logger, span
from agent_ledger.options import (
    EffectLedgerOptions,
    LedgerHooks,
    ResolvedRunOptions,
    RunOptions,
    merge_run_options,
    resolve,
)
from agent_ledger.polling import SharedPolls
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores.base import Decision, EffectQuery, LedgerStats, NewEffect, Store

__all__ = ["EffectLedger"]

T = TypeVar("T")

_PROCESSING: Final = EffectStatus.PROCESSING
_READY: Final = EffectStatus.READY
_REQUIRES_APPROVAL: Final = EffectStatus.REQUIRES_APPROVAL

#: Error code recorded when a handler's return value is not JSON.
RESULT_NOT_SERIALIZABLE: Final = "result_not_serializable"
#: Pauses between tries to record a handler's outcome after a store error.
COMMIT_RETRY_DELAYS_S: Final = (0.05, 0.2, 1.0)
#: Reason recorded when the task running a handler is cancelled.
CANCELLED_WHILE_RUNNING: Final = (
    "the task running the handler was cancelled ({exc}); whether the side effect "
    "happened is unknown, so the effect is not retried automatically"
)


@dataclass(frozen=True, slots=True)
class _Acquired:
    """Where ``begin`` ended: owning a ``processing`` effect, or at a terminal one."""

    effect: Effect
    owned: bool
    fresh: bool = False
    #: The effect came from another waiter's poll: copy its result before handing it out.
    shared: bool = False


class _Lost:
    """Marker: our commit lost to another attempt; the winner's outcome decides."""


_LOST: Final = _Lost()


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
        self._defaults = options.defaults.run
        self._resolved_defaults = resolve(self._defaults)
        self._max_args = options.max_args_size_bytes or DEFAULT_MAX_ARGS_SIZE_BYTES
        self._hooks = options.hooks if options.hooks is not None else LedgerHooks()
        self._heartbeats = Heartbeats(self._store)
        self._polls = SharedPolls(self._store)

    @property
    def store(self) -> Store:
        return self._store

    # -- the main entry ----------------------------------------------------

    @overload
    async def run(
        self,
        call: ToolCall,
        handler: Callable[[Effect], Awaitable[T]],
        run_options: RunOptions | None = None,
        hooks: LedgerHooks | None = None,
        tx: object | None = None,
    ) -> T: ...

    @overload
    async def run(
        self,
        call: ToolCall,
        handler: Callable[[Effect], T],
        run_options: RunOptions | None = None,
        hooks: LedgerHooks | None = None,
        tx: object | None = None,
    ) -> T: ...

    async def run(
        self,
        call: ToolCall,
        handler: Callable[[Effect], object],
        run_options: RunOptions | None = None,
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
        * approval required: waits for ``approve()``/``deny()``.

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
        opts = self._run_options(run_options)
        hooks = self._hooks if hooks is None else hooks
        new = self._new_effect(call)
        needs_approval = opts.requires_approval or self._policy_requires_approval(call, hooks)
        with span("agent_ledger.run", call.tool, new.idem_key):
            acquired = await self._acquire(new, opts, hooks, needs_approval, tx)
            while acquired.owned:
                outcome = await self._execute(acquired.effect, handler, opts, tx)
                if outcome is not _LOST:
                    return outcome
                acquired = await self._wait(new, acquired.effect, opts, tx)
            return _private(self._recorded_outcome(acquired.effect), acquired.shared)

    # -- driving the lifecycle by hand --------------------------------------

    async def begin(
        self,
        call: ToolCall,
        tx: object | None = None,
        *,
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
        opts = self._run_options(run_options)
        hooks = self._hooks if hooks is None else hooks
        new = self._new_effect(call)
        needs_approval = opts.requires_approval or self._policy_requires_approval(call, hooks)
        acquired = await self._acquire(new, opts, hooks, needs_approval, tx)
        if acquired.owned:
            return BeginResult(
                acquired.effect,
                cached=False,
                idempotency_status="fresh" if acquired.fresh else "replayed",
            )
        result = _private(self._recorded_outcome(acquired.effect), acquired.shared)
        return BeginResult(
            acquired.effect, cached=True, idempotency_status="replayed", cached_result=result
        )

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
        _require_str(effect_id, "effect_id")
        if attempt is not None and (type(attempt) is not int or attempt < 1):
            raise EffectLedgerValidationError(
                f"attempt must be a positive int, got {attempt!r}", field="attempt"
            )
        if isinstance(outcome, CommitSucceeded):
            result_json = canonical_json(outcome.result, field="result", sort_keys=False).decode()
            return await self._store.complete(
                effect_id,
                attempt=attempt,
                status=EffectStatus.SUCCEEDED,
                result_json=result_json,
                error=None,
                tx=tx,
            )
        if isinstance(outcome, CommitFailed) and isinstance(outcome.error, EffectError):
            return await self._store.complete(
                effect_id,
                attempt=attempt,
                status=EffectStatus.FAILED,
                result_json=None,
                error=outcome.error,
                tx=tx,
            )
        raise EffectLedgerValidationError(
            "outcome must be CommitSucceeded(result=...) or CommitFailed(error=EffectError(...)), "
            f"got {outcome!r}",
            field="outcome",
        )

    async def heartbeat(self, effect_id: str, attempt: int) -> bool:
        """Show that the worker holding ``attempt`` is alive (for begin/commit workers).

        Returns False when the worker no longer holds the effect: stop, and
        do not expect ``commit()`` to be accepted.
        """
        _require_str(effect_id, "effect_id")
        return await self._store.heartbeat(effect_id, attempt)

    # -- approvals and admin --------------------------------------------------

    async def request_approval(self, idem_key: str) -> bool:
        """Move a ``processing`` effect to ``requires_approval``; True if it moved."""
        moved = await self._transition(idem_key, _REQUIRES_APPROVAL, None, None)
        if moved is not None:
            await self._notify_approval_required(moved, self._hooks)
        return moved is not None

    async def approve(self, idem_key: str, by: str | None = None, note: str | None = None) -> bool:
        """Approve a pending effect (``requires_approval`` -> ``ready``); True if it moved.

        ``by`` and ``note`` are kept on the receipt. A waiting ``run()`` then
        claims the effect and runs the handler.
        """
        decision = _decision(by, note)
        return await self._transition(idem_key, _READY, None, decision) is not None

    async def deny(self, idem_key: str, reason: str | None = None, by: str | None = None) -> bool:
        """Deny a pending effect (-> ``denied``, terminal); True if it moved."""
        error = EffectError(message=_reason(reason, "denied"), code="denied")
        decision = _decision(by, None)
        return await self._transition(idem_key, EffectStatus.DENIED, error, decision) is not None

    async def cancel(self, idem_key: str, reason: str | None = None, by: str | None = None) -> bool:
        """Cancel a non-terminal effect (-> ``canceled``, terminal); True if it moved.

        A handler already running is not interrupted, but its commit will be
        rejected and callers get ``EffectDeniedError``.
        """
        error = EffectError(message=_reason(reason, "canceled"), code="canceled")
        decision = _decision(by, None)
        return await self._transition(idem_key, EffectStatus.CANCELED, error, decision) is not None

    # -- audit -------------------------------------------------------------------

    async def list_effects(
        self,
        workflow_id: str | None = None,
        tool: str | None = None,
        status: EffectStatus | str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> EffectPage:
        """Effects matching every given filter, newest first, a page at a time.

        Pass the returned ``next_cursor`` back as ``cursor`` for the next
        page; pagination is by position (``created_at``, ``id``), so effects
        created meanwhile never shift or repeat a page. ``since`` is
        inclusive and ``until`` exclusive, on ``created_at``.
        """
        query = build_query(
            workflow_id=workflow_id,
            tool=tool,
            status=status,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
        )
        effects = await self._store.list_effects(query)
        last = effects[-1] if len(effects) == query.limit else None
        return EffectPage(effects, encode_cursor(last) if last is not None else None)

    async def pending_approvals(self, limit: int = 100) -> list[Effect]:
        """Effects waiting for a human, newest first."""
        page = await self.list_effects(status=EffectStatus.REQUIRES_APPROVAL, limit=limit)
        return page.effects

    async def stats(self) -> LedgerStats:
        """Counts by status and by tool, and how many calls were duplicates."""
        return await self._store.stats()

    async def purge(
        self, older_than: timedelta, statuses: frozenset[EffectStatus] = TERMINAL
    ) -> int:
        """Delete terminal effects completed at least ``older_than`` ago; return how many.

        Never removes an effect that could still change: asking for a
        non-terminal status raises ``EffectLedgerValidationError``.
        """
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise EffectLedgerValidationError(
                f"older_than must be a non-negative timedelta, got {older_than!r}",
                field="older_than",
            )
        return await self._store.purge(older_than=older_than, statuses=frozenset(statuses))

    async def get_effect(self, effect_id: str) -> Effect | None:
        """The effect with this id, or None."""
        _require_str(effect_id, "effect_id")
        return await self._store.get(effect_id)

    async def find_by_idem_key(self, idem_key: str) -> Effect | None:
        """The effect with this idempotency key, or None."""
        _require_str(idem_key, "idem_key")
        return await self._store.find(idem_key)

    async def lookup(self, ref: str) -> Effect | None:
        """The effect ``ref`` names: its id, its idempotency key, or a unique prefix
        of the key (at least 8 hex characters), as people copy them from a listing.

        Returns None when nothing matches; a prefix that matches several
        effects raises ``EffectLedgerValidationError`` listing how to narrow it.
        """
        _require_str(ref, "ref")
        ref = ref.strip().lower()
        if _looks_like_uuid(ref):
            return await self._store.get(ref)
        if not _HEX.fullmatch(ref) or len(ref) < MIN_KEY_PREFIX:
            raise EffectLedgerValidationError(
                f"{ref!r} is neither an effect id nor an idempotency key (or a prefix of one "
                f"with at least {MIN_KEY_PREFIX} hex characters)",
                field="ref",
            )
        if len(ref) == 64:
            return await self._store.find(ref)
        matches = await self._store.list_effects(EffectQuery(idem_key_prefix=ref, limit=2))
        if len(matches) > 1:
            raise EffectLedgerValidationError(
                f"key prefix {ref!r} matches several effects; give more characters",
                field="ref",
            )
        return matches[0] if matches else None

    def idem_key(self, call: ToolCall) -> str:
        """The idempotency key ``run(call, ...)`` would use (see ``agent_ledger.keys``)."""
        return self._new_effect(call).idem_key

    # -- internals --------------------------------------------------------------

    def _run_options(self, run_options: RunOptions | None) -> ResolvedRunOptions:
        if run_options is None:
            return self._resolved_defaults
        if not isinstance(run_options, RunOptions):
            raise EffectLedgerValidationError(
                f"run_options must be a RunOptions, got {type(run_options).__name__}",
                field="run_options",
            )
        return resolve(merge_run_options(self._defaults, run_options))

    def _new_effect(self, call: ToolCall) -> NewEffect:
        if not isinstance(call, ToolCall):
            raise EffectLedgerValidationError(
                f"call must be a ToolCall, got {type(call).__name__}", field="call"
            )
        canon = canonicalize(call, self._max_args)
        return NewEffect(
            idem_key=canon.idem_key,
            workflow_id=call.workflow_id,
            call_id=call.call_id,
            tool=call.tool,
            args_canonical=canon.args_canonical,
            resource_id_canonical=canon.resource_id_canonical,
        )

    @staticmethod
    def _policy_requires_approval(call: ToolCall, hooks: LedgerHooks) -> bool:
        # Asked before begin(), so a policy that raises leaves nothing stored;
        # the answer only matters if begin() creates the effect.
        policy = hooks.requires_approval
        return policy is not None and bool(policy(call))

    async def _acquire(
        self,
        new: NewEffect,
        opts: ResolvedRunOptions,
        hooks: LedgerHooks,
        needs_approval: bool,
        tx: object | None,
    ) -> _Acquired:
        begun = await self._store.begin(new, tx=tx)
        effect = begun.effect
        if begun.created:
            if not needs_approval:
                _log_debug("effect created", effect)
                return _Acquired(effect, owned=True, fresh=True)
            moved = await self._store.transition(new.idem_key, target=_REQUIRES_APPROVAL, tx=tx)
            if moved is not None:
                effect = moved
                _log_info("effect requires approval", effect)
                await self._notify_approval_required(moved, hooks)
        elif effect.status.is_terminal:
            _log_debug("effect replayed", effect)
            return _Acquired(effect, owned=False)
        return await self._wait(new, effect, opts, tx)

    async def _wait(
        self, new: NewEffect, effect: Effect, opts: ResolvedRunOptions, tx: object | None
    ) -> _Acquired:
        """Poll (woken early by notifications) until we own the effect or it ends."""
        c = opts.concurrency
        stale_after_ms = opts.stale_after_ms
        key = new.idem_key
        loop = asyncio.get_running_loop()
        waiting_for_approval: bool | None = None
        phase_started = 0.0
        interval_ms = float(c.initial_interval_ms)
        async with self._store.subscribe(key) as changes:
            while True:
                # Polling after subscribing means no change between the
                # caller's last read and this wait can be missed.
                claimable = effect.status is _READY or (
                    effect.status is _PROCESSING and stale_after_ms > 0
                )
                try:
                    current, claimed, shared = await self._polls.poll(
                        key, claim_stale_after_ms=stale_after_ms if claimable else None, tx=tx
                    )
                    poll_error = None
                except EffectStoreError as exc:
                    # Waiting is retryable: a failed poll (a dropped connection,
                    # a restarting server) is no news, and the next poll tries
                    # again. Inside a transaction the error aborted it: give up.
                    if tx is not None:
                        raise
                    _log_warning(f"poll failed while waiting ({exc}); retrying", effect)
                    current, claimed, shared, poll_error = effect, False, False, exc
                if claimed and current is not None:
                    _log_claimed(current)
                    return _Acquired(current, owned=True)
                if current is None:
                    raise EffectLedgerInvariantError(
                        f"effect {key} disappeared from the store while a caller waited on it"
                    )
                effect = current
                if effect.status.is_terminal:
                    return _Acquired(effect, owned=False, shared=shared)
                if effect.status is _READY and poll_error is None:
                    continue  # approved since we last looked: claim it now, not after a sleep
                approval_phase = effect.status is _REQUIRES_APPROVAL
                now = loop.time()
                if approval_phase is not waiting_for_approval:
                    # A new phase (e.g. approved, now running elsewhere) gets a fresh budget.
                    waiting_for_approval = approval_phase
                    phase_started = now
                    interval_ms = float(c.initial_interval_ms)
                limit_ms = c.approval_timeout_ms if approval_phase else c.wait_timeout_ms
                waited_ms = (now - phase_started) * 1000.0
                if limit_ms is not None and waited_ms >= limit_ms:
                    if poll_error is not None:
                        raise poll_error  # the store, not the other caller, is the problem
                    raise EffectTimeoutError(key, effect.status.value, waited_ms, limit_ms)
                delay_ms = interval_ms * (1.0 + c.jitter_factor * random.uniform(-1.0, 1.0))
                if limit_ms is not None:
                    delay_ms = min(delay_ms, limit_ms - waited_ms)
                await changes.wait(delay_ms / 1000.0)
                interval_ms = min(interval_ms * c.backoff_multiplier, float(c.max_interval_ms))

    async def _execute(
        self,
        effect: Effect,
        handler: Callable[[Effect], object],
        opts: ResolvedRunOptions,
        tx: object | None,
    ) -> object:
        """Run the handler for an owned effect and record what happened.

        Returns the handler's value, raises what it raised, or returns
        ``_LOST`` when another attempt's commit won.
        """
        # Inside a transaction the row is invisible to other workers until
        # commit, so nobody can take it over and no heartbeat is needed.
        heartbeat = (
            self._heartbeats.start(effect, opts.stale_after_ms)
            if opts.stale_after_ms > 0 and tx is None
            else None
        )
        try:
            value = handler(effect)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            if heartbeat is not None:
                heartbeat.stop()
            error = EffectError(message=str(exc) or type(exc).__name__, code=_error_code(exc))
            if await self._finish(effect, EffectStatus.FAILED, None, error, tx):
                _log_info("effect failed", effect)
                raise
            return _LOST
        except BaseException as exc:
            # CancelledError (and KeyboardInterrupt/SystemExit): record it so
            # the effect does not sit in processing until the stale window.
            if heartbeat is not None:
                heartbeat.stop()
            await self._record_abandoned(effect, exc, tx)
            raise
        if heartbeat is not None:
            heartbeat.stop()
        try:
            result_json = canonical_json(value, field="result", sort_keys=False).decode()
        except EffectLedgerValidationError as exc:
            error = EffectError(message=str(exc), code=RESULT_NOT_SERIALIZABLE)
            if await self._finish(effect, EffectStatus.FAILED, None, error, tx):
                raise
            return _LOST
        if await self._finish(effect, EffectStatus.SUCCEEDED, result_json, None, tx):
            _log_debug("effect succeeded", effect)
            return value
        return _LOST

    async def _finish(
        self,
        effect: Effect,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None,
    ) -> bool:
        """Record a handler's outcome; True if this attempt's commit won.

        Store errors are retried a few times: the side effect has happened by
        now, and giving up at the first broken connection would leave the
        effect in processing for the next caller to take over and run again.
        The compare-and-set is safe to repeat: if an earlier try landed before
        its connection broke, the retry matches no row and the stored effect
        shows our attempt and status, which counts as ours. Inside a caller's
        transaction a failed statement aborts the transaction, so there is
        nothing to retry.
        """
        delays = () if tx is not None else COMMIT_RETRY_DELAYS_S
        for retry, delay in enumerate((*delays, None)):
            try:
                won = await self._store.complete(
                    effect.id,
                    attempt=effect.attempt,
                    status=status,
                    result_json=result_json,
                    error=error,
                    tx=tx,
                )
            except EffectStoreError:
                if delay is None:
                    raise
                _log_warning(f"recording the outcome failed; retrying in {delay} s", effect)
                await asyncio.sleep(delay)
                continue
            if not won and retry > 0:
                stored = await self._store.get(effect.id, tx=tx)
                won = (
                    stored is not None
                    and stored.status is status
                    and stored.attempt == effect.attempt
                )
            if not won:
                _log_warning(
                    "commit rejected: another attempt or a decision got there first", effect
                )
            return won
        raise EffectLedgerInvariantError("unreachable: the last try either returns or raises")

    async def _record_abandoned(
        self, effect: Effect, exc: BaseException, tx: object | None
    ) -> None:
        error = EffectError(
            message=CANCELLED_WHILE_RUNNING.format(exc=type(exc).__name__), code="cancelled"
        )
        try:
            # Shielded: a second cancel must not interrupt the write itself.
            await asyncio.shield(self._finish(effect, EffectStatus.CANCELED, None, error, tx))
        except Exception:
            logger.exception(
                "could not record the cancelled run; the effect stays processing until "
                "its stale window passes",
                extra=effect_fields(effect),
            )

    async def _transition(
        self,
        idem_key: str,
        target: EffectStatus,
        error: EffectError | None,
        decision: Decision | None,
    ) -> Effect | None:
        _require_str(idem_key, "idem_key")
        moved = await self._store.transition(
            idem_key, target=target, error=error, decision=decision
        )
        if moved is not None:
            _log_info(f"effect moved to {target.value}", moved)
        return moved

    async def _notify_approval_required(self, effect: Effect, hooks: LedgerHooks) -> None:
        hook = hooks.on_approval_required
        if hook is None:
            return
        try:
            await hook(effect)
        except Exception:
            logger.exception(
                "on_approval_required hook raised; the effect still waits for approval",
                extra=effect_fields(effect),
            )

    @staticmethod
    def _recorded_outcome(effect: Effect) -> object:
        status = effect.status
        if status is EffectStatus.SUCCEEDED:
            return effect.result
        if status is EffectStatus.FAILED:
            raise EffectFailedError(effect)
        if status is EffectStatus.DENIED or status is EffectStatus.CANCELED:
            raise EffectDeniedError(effect)
        raise EffectLedgerInvariantError(f"no recorded outcome for a {status.value} effect")


def _private(result: object, shared: bool) -> object:
    """A caller's own copy of a result that other waiters received too."""
    if shared and isinstance(result, dict | list):
        return orjson.loads(orjson.dumps(result))
    return result


def _error_code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if code is None or isinstance(code, bool):
        return type(exc).__name__
    return code if isinstance(code, str) else str(code)


#: The shortest idempotency-key prefix ``lookup`` accepts.
MIN_KEY_PREFIX: Final = 8
_HEX: Final = re.compile(r"[0-9a-f]+")


def _looks_like_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def _decision(by: str | None, note: str | None) -> Decision:
    for value, name in ((by, "by"), (note, "note")):
        if value is not None and not isinstance(value, str):
            raise EffectLedgerValidationError(
                f"{name} must be a string or None, got {type(value).__name__}", field=name
            )
    return Decision(
        by=storable_text(by) if by else None, note=storable_text(note) if note else None
    )


def _reason(reason: str | None, what: str) -> str:
    if reason is None:
        return what
    if not isinstance(reason, str):
        raise EffectLedgerValidationError(
            f"reason must be a string or None, got {type(reason).__name__}", field="reason"
        )
    return reason or what


def _require_str(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise EffectLedgerValidationError(
            f"{name} must be a string, got {type(value).__name__}", field=name
        )


def _log_debug(message: str, effect: Effect) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s: %s", message, effect.tool, extra=effect_fields(effect))


def _log_info(message: str, effect: Effect) -> None:
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s: %s", message, effect.tool, extra=effect_fields(effect))


def _log_warning(message: str, effect: Effect) -> None:
    logger.warning("%s: %s", message, effect.tool, extra=effect_fields(effect))


def _log_claimed(effect: Effect) -> None:
    # attempt 2+ from ready is an approval; from processing it is a takeover.
    _log_info(f"claimed effect (attempt {effect.attempt})", effect)
