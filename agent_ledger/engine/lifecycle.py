"""An effect's life in one caller: prepare, acquire, execute, record.

* **prepare** checks the call and options and computes the key, before
  anything is stored (bad input stores nothing);
* **acquire** inserts the effect or finds it; a caller that created it
  owns it, any other waits (``waiting``) until it may claim it or it ends;
* **execute** runs the handler of an owned effect, with heartbeats;
* **record** commits the outcome, fenced by the attempt, retrying store
  errors on the ``backoff.COMMIT_RETRY`` schedule until the lease runs out.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Final, Literal, NamedTuple

import orjson

from agent_ledger.backoff import COMMIT_RETRY
from agent_ledger.calls import ToolCall
from agent_ledger.decisions import notify_approval_required
from agent_ledger.effects import (
    BeginResult,
    CommitFailed,
    CommitOutcome,
    CommitSucceeded,
    Effect,
    EffectError,
    FailedWithUsage,
    Parked,
    TryFailure,
    Usage,
    WithUsage,
    usage_to_json,
)
from agent_ledger.engine.deadline import Late, late_outcome, within
from agent_ledger.engine.heartbeats import Beat, Heartbeats
from agent_ledger.engine.ownership import own
from agent_ledger.engine.parking import mark_started
from agent_ledger.engine.waiting import Acquired, Waiter
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectDeniedError,
    EffectFailedError,
    EffectInFlightError,
    EffectLedgerInvariantError,
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    EffectStoreError,
    HandlerTimeoutError,
    is_handler_timeout,
    require_str,
)
from agent_ledger.keys import (
    DEFAULT_MAX_ARGS_SIZE_BYTES,
    CanonicalCall,
    canonical_json,
    canonicalize,
    mismatched_args,
)
from agent_ledger.legacy.keys import legacy_key_or_none, legacy_mismatched_args
from agent_ledger.observability import effect_fields, log_effect, logger
from agent_ledger.options import (
    DEFAULT_STALE_AFTER_MS,
    EffectLedgerOptions,
    LedgerHooks,
    ResolvedRunOptions,
    RunOptions,
    merge_run_options,
    resolve,
)
from agent_ledger.retries import RETRIES_EXHAUSTED, RetryPolicy
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import BeginOutcome, Held, NewEffect, SchemaCheck, Store

__all__ = ["CANCELLED_WHILE_RUNNING", "RESULT_NOT_SERIALIZABLE", "Acquired", "Engine", "Prepared"]

#: Error code recorded when a handler's return value is not JSON.
RESULT_NOT_SERIALIZABLE: Final = "result_not_serializable"
#: The error code of a handler whose returned ``usage`` could not be recorded.
USAGE_NOT_SERIALIZABLE: Final = "usage_not_serializable"
#: Reason recorded when an effect was taken over more than ``max_takeovers`` times.
TOO_MANY_TAKEOVERS: Final = (
    "taken over {n} times (max_takeovers={limit}): each holder stopped heartbeating "
    "before it finished, so the handler may be blocking its event loop or outliving its "
    "lease; not run again automatically. Check whether the side effect happened."
)
#: Reason recorded when the task running a handler is cancelled.
CANCELLED_WHILE_RUNNING: Final = (
    "the task running the handler was cancelled ({exc}); whether the side effect "
    "happened is unknown, so the effect is not retried automatically"
)
#: Reason recorded when the task is cancelled while it waits to retry.
CANCELLED_BEFORE_RETRY: Final = (
    "the task was cancelled ({exc}) while it waited to retry after try {n}; the effect "
    "is not retried automatically (reopen() it to run it again)"
)
#: Reason recorded when a retry policy's tries ran out.
RETRIES_RAN_OUT: Final = "gave up after {n} tries (attempts={limit}); last error: {error}"
#: Reason recorded when the next try would start past the policy's time budget.
RETRY_TIME_RAN_OUT: Final = (
    "gave up after {n} tries: the next would start {ms:.0f} ms after the first, past "
    "timeout_ms={limit}; last error: {error}"
)
#: Reason recorded when a claim finds every try used by a worker that then stopped.
TRIES_USED_BEFORE: Final = (
    "gave up after {n} tries (attempts={limit}): the worker that made the last one "
    "stopped before recording the outcome; last error: {error}"
)


class Prepared(NamedTuple):
    """A checked call, ready to acquire: what ``run()`` and ``begin()`` share."""

    new: NewEffect
    opts: ResolvedRunOptions
    hooks: LedgerHooks
    needs_approval: bool
    #: The call's ``validate_keys``: checked against an effect it finds.
    validate_keys: Sequence[str] | Literal["all"] | None = None
    #: The call's 0.2.x key, with ``legacy_keys=True`` (None otherwise).
    legacy_key: str | None = None


class _Recorded(NamedTuple):
    """How executing an owned effect ended, when it did not raise."""

    #: False: another attempt's commit (or a decision) got there first.
    won: bool
    #: The handler's own return value, when ``won``.
    value: object = None


_LOST: Final = _Recorded(won=False)


class Engine:
    """Runs effects for one ledger: at most one execution per idempotency key."""

    def __init__(self, options: EffectLedgerOptions) -> None:
        self._store: Store = options.store
        self._defaults = options.defaults.run
        self._resolved_defaults = resolve(self._defaults)
        self._max_args = options.max_args_size_bytes or DEFAULT_MAX_ARGS_SIZE_BYTES
        self.hooks = options.hooks if options.hooks is not None else LedgerHooks()
        self._legacy_keys = options.legacy_keys
        self._heartbeats = Heartbeats(self._store)
        self._waiter = Waiter(self._store)
        # Retries wait and keep their time budget by the ledger's clock, so
        # tests can run them on a ManualClock without sleeping.
        self._clock = options.clock
        self._sleep = options.sleep
        #: Shared with decisions and audit: the schema is checked on first use.
        self.schema = SchemaCheck(self._store)

    # -- prepare ---------------------------------------------------------------

    def prepare(
        self, call: ToolCall, run_options: RunOptions | None, hooks: LedgerHooks | None
    ) -> Prepared:
        """Check everything about a call before anything is stored."""
        opts = self._run_options(run_options)
        if hooks is None:
            hooks = self.hooks
        elif not isinstance(hooks, LedgerHooks):
            raise EffectLedgerValidationError(
                f"hooks must be a LedgerHooks, got {type(hooks).__name__}", field="hooks"
            )
        canon = self._canonical(call)
        # Asked before begin(), so a policy that raises leaves nothing stored;
        # the answer only matters if begin() creates the effect.
        policy = hooks.requires_approval
        needs_approval = opts.requires_approval or (
            policy is not None and _policy_says_yes(policy, call)
        )
        # The creator's lease is recorded with the effect: others judge its
        # heartbeat by it, never by their own (maybe shorter) window.
        new = NewEffect(
            canon.idem_key,
            call.workflow_id,
            call.call_id,
            call.tool,
            canon.args_canonical,
            canon.resource_id_canonical,
            needs_approval,
            opts.stale_after_ms,
        )
        legacy = legacy_key_or_none(call) if self._legacy_keys else None
        return Prepared(new, opts, hooks, needs_approval, call.validate_keys, legacy)

    def approval_policy(
        self, run_options: RunOptions | None, hooks: LedgerHooks | None
    ) -> bool | Callable[[ToolCall], bool]:
        """Which fresh calls ``prepare`` would make wait for a person, with these options.

        ``True`` (all: ``requires_approval`` resolved to True), ``False``
        (none: it resolved to False and there is no policy hook) or the
        hook, asked per call exactly as ``prepare`` asks it.
        """
        opts = self._run_options(run_options)
        if hooks is None:
            hooks = self.hooks
        elif not isinstance(hooks, LedgerHooks):
            raise EffectLedgerValidationError(
                f"hooks must be a LedgerHooks, got {type(hooks).__name__}", field="hooks"
            )
        if opts.requires_approval:
            return True
        policy = hooks.requires_approval
        if policy is None:
            return False
        return functools.partial(_policy_says_yes, policy)

    def idem_key(self, call: ToolCall) -> str:
        """The idempotency key ``prepare`` computes for ``call``."""
        return self._canonical(call).idem_key

    def _canonical(self, call: ToolCall) -> CanonicalCall:
        if not isinstance(call, ToolCall):
            raise EffectLedgerValidationError(
                f"call must be a ToolCall, got {type(call).__name__}", field="call"
            )
        return canonicalize(call, self._max_args)

    def _run_options(self, run_options: RunOptions | None) -> ResolvedRunOptions:
        if run_options is None:
            return self._resolved_defaults
        if not isinstance(run_options, RunOptions):
            raise EffectLedgerValidationError(
                f"run_options must be a RunOptions, got {type(run_options).__name__}",
                field="run_options",
            )
        return resolve(merge_run_options(self._defaults, run_options))

    # -- run and begin -----------------------------------------------------------

    async def run(
        self,
        prepared: Prepared,
        handler: Callable[[Effect], object],
        tx: object | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> object:
        """Acquire, execute while we own the effect, and return its outcome.

        ``loop`` is the running loop when the caller already has it (see
        ``Heartbeats.start``: asking Python 3.11 for it is a system call).
        """
        if not callable(handler):
            # Checked before anything is stored: a handler that cannot be
            # called would otherwise be recorded as the effect's failure.
            raise EffectLedgerValidationError(
                f"handler must be callable, got {type(handler).__name__}", field="handler"
            )
        if tx is not None and prepared.opts.retry is not None:
            raise EffectLedgerValidationError(
                "a retry policy cannot be used inside a transaction (tx=): the waits "
                "between tries would hold the transaction's locks, and its rollback would "
                "undo the record of each try. Run it without tx=, or without retry.",
                field="retry",
            )
        if prepared.legacy_key is not None:
            prepared = await self._follow_legacy_key(prepared, prepared.legacy_key, tx)
        acquired = await self.acquire(prepared, tx)
        while acquired.owned:
            recorded = await self.execute(acquired.effect, handler, prepared.opts, tx, loop)
            if recorded.won:
                return recorded.value
            # Our commit lost to another attempt: the winner's outcome decides.
            acquired = await self._wait(prepared, acquired.effect, tx)
        return recorded_outcome(acquired)

    async def begin(self, prepared: Prepared, tx: object | None) -> BeginResult[object]:
        """Acquire without a handler: the caller executes and commits."""
        if prepared.legacy_key is not None:
            prepared = await self._follow_legacy_key(prepared, prepared.legacy_key, tx)
        acquired = await self.acquire(prepared, tx)
        while acquired.owned and prepared.opts.on_stale == "park":
            # The caller runs the tool as soon as this returns: its start is now.
            marked = await mark_started(self._store, acquired.effect, tx)
            if marked is not None:
                acquired = acquired._replace(effect=marked)
                break
            acquired = await self._wait(prepared, acquired.effect, tx)
        if acquired.owned:
            return BeginResult(
                acquired.effect,
                cached=False,
                idempotency_status="fresh" if acquired.fresh else "replayed",
            )
        return BeginResult(
            acquired.effect,
            cached=True,
            idempotency_status="replayed",
            cached_result=recorded_outcome(acquired),
        )

    # -- acquire -------------------------------------------------------------------

    async def acquire(self, prepared: Prepared, tx: object | None) -> Acquired:
        """Own a ``processing`` effect, or reach a terminal one, waiting as needed."""
        new = prepared.new
        if not self.schema.ok:
            await self.schema.ensure(tx)
        if tx is not None and prepared.needs_approval:
            await self._refuse_new_approval_in_transaction(new, tx)
        if tx is None:
            # Cancelled while the insert is in flight: wait for it, and give
            # back an effect it created for us to run (see ownership).
            begun = await own(self._store, self._store.begin(new), _created_to_run, name="begin")
        else:
            begun = await self._store.begin(
                new, tx=tx, lock_timeout_ms=prepared.opts.tx_lock_timeout_ms
            )
        effect = begun.effect
        if not begun.created and prepared.validate_keys is not None:
            # Before any waiting: a caller with other values must never get
            # (or wait for) the outcome of a request it did not make.
            differ = mismatched_args(
                effect.args_canonical, new.args_canonical, prepared.validate_keys
            )
            if differ:
                log_effect(logging.INFO, f"payload mismatch on {list(differ)}", effect)
                raise EffectPayloadMismatchError(effect, differ)
        if begun.created:
            if effect.status is not EffectStatus.REQUIRES_APPROVAL:
                log_effect(logging.DEBUG, "effect created", effect)
                return Acquired(effect, owned=True, fresh=True)
            # Inserted waiting for a person, in the same atomic step.
            log_effect(logging.INFO, "effect requires approval", effect)
            await notify_approval_required(effect, prepared.hooks)
        elif effect.status.is_terminal:
            log_effect(logging.DEBUG, "effect replayed", effect)
            return Acquired(effect, owned=False)
        return await self._wait(prepared, effect, tx)

    async def _follow_legacy_key(
        self, prepared: Prepared, legacy_key: str, tx: object | None
    ) -> Prepared:
        """``legacy_keys=True``: the call goes on under the key of the effect its
        0.2.x key was imported as, so it is answered (replayed, waited for,
        claimed) exactly as that effect's own calls are. Before ``acquire``,
        so that every later step of the run (waiting again after a lost
        commit included) uses that key.

        Not when nothing was imported under that key, or the effect found is
        another workflow's or tool's: 0.2.x's ``"|"`` join gave both the same
        key, and that receipt is not this call's.
        """
        new = prepared.new
        if not self.schema.ok:
            await self.schema.ensure(tx)
        effect = await self._store.find_legacy(legacy_key, tx=tx)
        if (
            effect is None
            or effect.idem_key == new.idem_key
            or (effect.workflow_id, effect.tool) != (new.workflow_id, new.tool)
        ):
            return prepared
        if prepared.validate_keys is not None:
            # Compared as 0.2.x compared them: its records cannot tell 1 from 1.0.
            differ = legacy_mismatched_args(
                effect.args_canonical, new.args_canonical, prepared.validate_keys
            )
            if differ:
                log_effect(logging.INFO, f"payload mismatch on {list(differ)}", effect)
                raise EffectPayloadMismatchError(effect, differ)
        log_effect(logging.DEBUG, "answered by the effect imported under its 0.2.x key", effect)
        return prepared._replace(new=new._replace(idem_key=effect.idem_key), validate_keys=None)

    async def _refuse_new_approval_in_transaction(self, new: NewEffect, tx: object) -> None:
        """An effect that needs approval cannot start inside a caller's transaction.

        Nobody outside can see it, so nobody can approve it, until the
        transaction commits; waiting for the approval inside it would wait
        for ever. An existing effect (a replay) is fine.
        """
        if await self._store.find(new.idem_key, tx=tx) is None:
            raise EffectLedgerValidationError(
                f"{new.tool} needs approval, and an effect that needs approval cannot be "
                "created inside a transaction (nobody can approve it before the transaction "
                "commits). Call run() without tx=, or request the approval in its own step.",
                field="tx",
            )

    async def _wait(self, prepared: Prepared, effect: Effect, tx: object | None) -> Acquired:
        """Wait for the effect; a claim past ``max_takeovers`` ends it as failed instead.

        Inside a caller's transaction there is no waiting: an approved
        effect is claimed at once, anything else held elsewhere raises
        ``EffectInFlightError`` (see there for why).
        """
        if tx is not None:
            return await self._claim_in_transaction(prepared, effect, tx)
        acquired = await self._waiter.wait(
            prepared.new.idem_key,
            effect,
            prepared.opts,
            tx,
            on_parked=functools.partial(notify_approval_required, hooks=prepared.hooks),
        )
        limit = prepared.opts.max_takeovers
        claimed = acquired.effect
        if not acquired.owned or limit is None or takeovers(claimed) <= limit:
            return acquired
        error = EffectError(
            message=TOO_MANY_TAKEOVERS.format(n=takeovers(claimed), limit=limit),
            code="too_many_takeovers",
        )
        # Just claimed: the lease is whole.
        until = lease_end(asyncio.get_running_loop().time(), prepared.opts.stale_after_ms)
        # started=False: no handler ran for this claim, so it is no execution.
        if await self._record_landed(
            claimed, EffectStatus.FAILED, None, error, tx, until, ends_try=False, started=False
        ):
            log_effect(logging.WARNING, "effect failed: too many takeovers", claimed)
        stored = await self._store.get(claimed.id, tx=tx)
        if stored is None or not stored.status.is_terminal:
            # Someone decided meanwhile (a cancel): wait for where it ends.
            return await self._wait(prepared, stored or claimed, tx)
        return Acquired(stored, owned=False)

    async def _claim_in_transaction(
        self, prepared: Prepared, effect: Effect, tx: object
    ) -> Acquired:
        key = prepared.new.idem_key
        if effect.status is EffectStatus.READY:
            # stale_after_ms=0: an approved effect is claimed, a held one never;
            # should the caller leave it processing (begin() without commit()),
            # its own lease applies once the transaction commits.
            outcome = await self._store.claim(
                key,
                stale_after_ms=0,
                lease_ms=prepared.opts.stale_after_ms,
                tx=tx,
                lock_timeout_ms=prepared.opts.tx_lock_timeout_ms,
            )
            if outcome.effect is None:
                raise EffectLedgerInvariantError(f"effect {key} disappeared inside a transaction")
            effect = outcome.effect
            if outcome.claimed:
                log_effect(logging.INFO, f"claimed effect (attempt {effect.attempt})", effect)
                return Acquired(effect, owned=True)
        if effect.status.is_terminal:
            return Acquired(effect, owned=False)
        if effect.status is EffectStatus.REQUIRES_APPROVAL and not prepared.opts.wait_for_approval:
            raise ApprovalPendingError(effect)
        raise EffectInFlightError(key, effect.status)

    # -- execute and record ------------------------------------------------------------

    async def execute(
        self,
        effect: Effect,
        handler: Callable[[Effect], object],
        opts: ResolvedRunOptions,
        tx: object | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> _Recorded:
        """Run the handler for an owned effect and record what happened.

        Returns the handler's value if our commit won, raises what the
        handler raised (after recording it), or returns a lost record when
        another attempt's commit won. With a retry policy, a retryable
        failure is recorded and the handler tried again (``_retry``).
        """
        policy = opts.retry
        if policy is not None and effect.tries >= policy.attempts:
            return await self._fail_used_up(effect, policy, opts, tx)
        if opts.on_stale == "park":
            marked = await mark_started(self._store, effect, tx)
            if marked is None:
                # Taken over or canceled before the handler started: theirs to decide.
                return _LOST
            effect = marked
        # Inside a transaction the row is invisible to other workers until
        # commit, so nobody can take it over and no heartbeat is needed.
        beat = (
            self._heartbeats.start(effect, opts.stale_after_ms, loop)
            if opts.stale_after_ms > 0 and tx is None
            else None
        )
        first_try_at = self._clock() if policy is not None else None
        try:
            if opts.timeout_ms is not None:
                value = await within(
                    opts.timeout_ms, functools.partial(_start, handler, effect, opts)
                )
            elif opts.sync_in_thread and not inspect.iscoroutinefunction(handler):
                # A plain function may block (a requests call, time.sleep): in a
                # worker thread it cannot stall the loop and with it the heartbeats.
                value = await _in_handler_thread(handler, effect)
            else:
                value = handler(effect)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            paid = type(exc) is FailedWithUsage  # never retried: a retry would pay again
            if paid or policy is None or first_try_at is None or not policy.retries(exc):
                until = self._stop_beat(beat, opts)
                error, usage_json, raised = _failure_of(exc)
                if await self._record_landed(
                    effect, EffectStatus.FAILED, None, error, tx, until, usage_json=usage_json
                ):
                    log_effect(logging.INFO, "effect failed", effect)
                    if raised is exc:
                        raise
                    raise raised from raised.__cause__
                return _LOST
            retryable = exc
        except BaseException as exc:
            # CancelledError (and KeyboardInterrupt/SystemExit): record it so
            # the effect does not sit in processing until the stale window.
            until = self._stop_beat(beat, opts)
            await self._record_abandoned(effect, exc, tx, until)
            raise
        else:
            if type(value) is Late:
                return await self._record_late(effect, value, opts, tx, beat)
            return await self._record_value(effect, value, opts, tx, beat)
        # Outside the except block, so that a later try's exception is not
        # chained to this one as if it had been raised while handling it.
        return await self._retry(effect, handler, opts, policy, beat, retryable, first_try_at)

    async def _record_value(
        self,
        effect: Effect,
        value: object,
        opts: ResolvedRunOptions,
        tx: object | None,
        beat: Beat | None,
    ) -> _Recorded:
        """Record the handler's return value as the outcome (a non-JSON one as a failure).

        A ``WithUsage`` value records its usage in the same commit and hands
        back only its ``result``. A value that cannot be stored fails the
        effect, once, and keeps the usage if that could be stored: a model
        call whose answer is not JSON was still paid for.
        """
        until = self._stop_beat(beat, opts)
        usage_json = None
        try:
            if type(value) is WithUsage:
                usage_json = _usage_json(value.usage)
                value = value.result
            result_json = canonical_json(value, field="result", sort_keys=False).decode()
        except EffectLedgerValidationError as exc:
            code = RESULT_NOT_SERIALIZABLE if exc.field == "result" else USAGE_NOT_SERIALIZABLE
            error = EffectError(message=str(exc), code=code)
            if await self._record_landed(
                effect, EffectStatus.FAILED, None, error, tx, until, usage_json=usage_json
            ):
                raise
            return _LOST
        if await self._record_landed(
            effect, EffectStatus.SUCCEEDED, result_json, None, tx, until, usage_json=usage_json
        ):
            log_effect(logging.DEBUG, "effect succeeded", effect)
            return _Recorded(won=True, value=value)
        return _LOST

    async def _record_late(
        self,
        effect: Effect,
        late: Late,
        opts: ResolvedRunOptions,
        tx: object | None,
        beat: Beat | None,
    ) -> _Recorded:
        """Record a handler that ran past its deadline (see ``deadline``); raise
        ``HandlerTimeoutError`` if the record is ours. Never retried."""
        assert opts.timeout_ms is not None
        until = self._stop_beat(beat, opts)
        usage_json = None
        try:
            if type(late.value) is WithUsage:  # a model call that answered late still cost
                usage_json = _usage_json(late.value.usage)
            elif type(late.exc) is FailedWithUsage:
                usage_json = _usage_json(late.exc.usage)
        except EffectLedgerValidationError:
            usage_json = None  # the late outcome is recorded all the same
        if type(late.value) is WithUsage:
            late = late._replace(value=late.value.result)
        status, result_json, error = late_outcome(late, opts.timeout_ms)
        if not await self._record_landed(
            effect, status, result_json, error, tx, until, usage_json=usage_json
        ):
            return _LOST
        log_effect(logging.WARNING, f"handler timed out: {error.message}", effect)
        recorded = dataclasses.replace(effect, status=status, error=error)
        raise HandlerTimeoutError(recorded) from late.exc

    # -- retries -----------------------------------------------------------------------

    async def _retry(
        self,
        effect: Effect,
        handler: Callable[[Effect], object],
        opts: ResolvedRunOptions,
        policy: RetryPolicy,
        beat: Beat | None,
        exc: Exception,
        first_try_at: datetime,
    ) -> _Recorded:
        """After a retryable failure: record it, wait, try again, until a try
        succeeds, fails for good, or the tries run out.

        Every try happens inside this one claim, with the heartbeat going
        on through the waits. Each failed try is recorded (``record_try``,
        fenced by the attempt) before the wait, so a worker that takes the
        effect over after a crash continues the count; if the record is
        refused, the effect is no longer ours (taken over, canceled) and its
        new owner decides. When the tries run out, the effect is recorded
        failed with ``retries_exhausted`` and ``exc``, the last try's own
        exception, is raised. Never called inside a caller's transaction.
        """
        tried = effect.tries
        try:
            while True:
                tried += 1  # the try that just failed with exc
                try:
                    held = await self._record_try(effect, tried, exc, beat, opts)
                except BaseException as stop:
                    if isinstance(stop, Exception):
                        raise  # a store error past the lease: the effect stays to its lease
                    # Cancelled while the try was being recorded (it may have landed).
                    until = self._stop_beat(beat, opts)
                    await self._record_abandoned(effect, stop, None, until, after_try=tried)
                    raise
                if not held:
                    log_effect(
                        logging.WARNING,
                        f"try {tried} failed and could not be recorded: the effect was taken "
                        "over or canceled meanwhile, so this worker stops trying",
                        effect,
                    )
                    return _LOST
                delay = policy.delay(tried, exc)
                gave_up = self._gave_up(policy, tried, exc, delay, first_try_at)
                if gave_up is not None:
                    until = self._stop_beat(beat, opts)
                    if await self._record_landed(
                        effect, EffectStatus.FAILED, None, gave_up, None, until, ends_try=False
                    ):
                        log_effect(logging.INFO, f"effect failed: {gave_up.message}", effect)
                        raise exc
                    return _LOST
                log_effect(
                    logging.INFO,
                    f"try {tried} of {policy.attempts} failed ({_error_of(exc)}); "
                    f"retrying in {delay:.3f} s",
                    effect,
                )
                try:
                    await self._sleep(delay)
                except BaseException as stop:
                    until = self._stop_beat(beat, opts)
                    await self._record_abandoned(effect, stop, None, until, after_try=tried)
                    raise
                try:
                    held = await self._still_held(effect, beat, opts)
                except BaseException as stop:
                    until = self._stop_beat(beat, opts)
                    await self._record_abandoned(effect, stop, None, until, after_try=tried)
                    raise
                if not held:
                    log_effect(logging.WARNING, "lost the effect while waiting to retry", effect)
                    return _LOST
                # The handler sees how many tries came before this one.
                effect = dataclasses.replace(effect, tries=tried)
                try:
                    value = await self._call(handler, effect, opts)
                except Exception as failed:
                    if type(failed) is not FailedWithUsage and policy.retries(failed):
                        exc = failed
                        continue
                    until = self._stop_beat(beat, opts)
                    error, usage_json, raised = _failure_of(failed)
                    if await self._record_landed(
                        effect, EffectStatus.FAILED, None, error, None, until, usage_json=usage_json
                    ):
                        log_effect(logging.INFO, "effect failed", effect)
                        if raised is failed:
                            raise
                        raise raised from raised.__cause__
                    return _LOST
                except BaseException as stop:
                    until = self._stop_beat(beat, opts)
                    await self._record_abandoned(effect, stop, None, until)
                    raise
                if type(value) is Late:
                    return await self._record_late(effect, value, opts, None, beat)
                return await self._record_value(effect, value, opts, None, beat)
        finally:
            if beat is not None:
                beat.stop()  # on every way out (stopping twice is harmless)

    async def _call(
        self, handler: Callable[[Effect], object], effect: Effect, opts: ResolvedRunOptions
    ) -> object:
        """One call of the handler, as ``execute`` makes its first (see there);
        a ``Late`` when it ran past its deadline."""
        if opts.timeout_ms is not None:
            return await within(opts.timeout_ms, functools.partial(_start, handler, effect, opts))
        if opts.sync_in_thread and not inspect.iscoroutinefunction(handler):
            value = await _in_handler_thread(handler, effect)
        else:
            value = handler(effect)
        if inspect.isawaitable(value):
            value = await value
        return value

    def _gave_up(
        self,
        policy: RetryPolicy,
        tried: int,
        exc: BaseException,
        delay: float,
        first_try_at: datetime,
    ) -> EffectError | None:
        """The error to record if no try may follow try ``tried``; None if one may."""
        if tried >= policy.attempts:
            message = RETRIES_RAN_OUT.format(n=tried, limit=policy.attempts, error=_error_of(exc))
            return EffectError(message=message, code=RETRIES_EXHAUSTED)
        if policy.timeout_ms is None:
            return None
        next_at_ms = (self._clock() - first_try_at).total_seconds() * 1000.0 + delay * 1000.0
        if next_at_ms <= policy.timeout_ms:
            return None
        message = RETRY_TIME_RAN_OUT.format(
            n=tried, ms=next_at_ms, limit=policy.timeout_ms, error=_error_of(exc)
        )
        return EffectError(message=message, code=RETRIES_EXHAUSTED)

    async def _record_try(
        self,
        effect: Effect,
        tried: int,
        exc: BaseException,
        beat: Beat | None,
        opts: ResolvedRunOptions,
    ) -> bool:
        """``Store.record_try`` for failed try number ``tried``; True if it was recorded.

        Store errors are retried like a commit's (``record``), on the
        ``COMMIT_RETRY`` schedule while the lease lasts, then raised. A
        repeat after a lost reply would count the try twice, so after an
        error the effect is read back first: still ours, with the count
        already at ``tried``, means the lost record landed.
        """
        error, error_type = _error_of(exc), _type_name(exc)
        step = 0
        while True:
            try:
                if step > 0:
                    stored = await self._store.get(effect.id)
                    if stored is None or stored.attempt != effect.attempt:
                        return False
                    if stored.status is EffectStatus.PROCESSING and stored.tries >= tried:
                        return True
                return await self._store.record_try(
                    effect.id, attempt=effect.attempt, error=error, error_type=error_type
                )
            except EffectStoreError:
                remaining_s = self._lease_until(beat, opts) - asyncio.get_running_loop().time()
                if remaining_s <= 0:
                    raise
                delay = COMMIT_RETRY.delay(step, remaining_s=remaining_s)
                log_effect(
                    logging.WARNING,
                    f"recording try {tried} failed; retrying in {delay:.2f} s",
                    effect,
                )
                await asyncio.sleep(delay)
                step += 1

    async def _still_held(
        self, effect: Effect, beat: Beat | None, opts: ResolvedRunOptions
    ) -> bool:
        """Before another try: does this worker still hold the effect? Asked of the store.

        A cancel, or a takeover after this worker's heartbeats stopped
        getting through (a partition, a paused process), may have landed
        during the wait, and the heartbeat that would tell is not due yet.
        So one fenced heartbeat goes out first: refreshed means still ours
        (and the lease starts over); refused means someone else decides
        now. A store that does not answer is asked again while the lease
        surely lasts; past that, no try may start. A row another
        transaction holds locked right now is read instead.
        """
        if beat is not None and beat.lost:
            return False
        held = Held(effect.id, effect.attempt)
        loop = asyncio.get_running_loop()
        step = 0
        while True:
            sent_at = loop.time()
            try:
                outcome = await self._store.heartbeat((held,))
            except EffectStoreError:
                remaining_s = self._lease_until(beat, opts) - loop.time()
                if remaining_s <= 0:
                    return False
                await asyncio.sleep(COMMIT_RETRY.delay(step, remaining_s=remaining_s))
                step += 1
                continue
            if held in outcome.refreshed:
                if beat is not None:
                    beat.confirmed_at = max(beat.confirmed_at, sent_at)
                return True
            if held in outcome.busy:
                stored = await self._store.get(effect.id)
                return (
                    stored is not None
                    and stored.status is EffectStatus.PROCESSING
                    and stored.attempt == effect.attempt
                )
            return False

    async def _fail_used_up(
        self, effect: Effect, policy: RetryPolicy, opts: ResolvedRunOptions, tx: object | None
    ) -> _Recorded:
        """Claimed an effect whose run already used every try (its last holder
        stopped before recording the outcome): record that, run nothing."""
        last = next((e for e in reversed(effect.history) if isinstance(e, TryFailure)), None)
        last_error = "unknown" if last is None else str(EffectError(last.message, last.code))
        message = TRIES_USED_BEFORE.format(n=effect.tries, limit=policy.attempts, error=last_error)
        error = EffectError(message=message, code=RETRIES_EXHAUSTED)
        until = lease_end(asyncio.get_running_loop().time(), opts.stale_after_ms)
        if not await self._record_landed(
            effect, EffectStatus.FAILED, None, error, tx, until, ends_try=False, started=False
        ):
            return _LOST
        log_effect(logging.INFO, f"effect failed: {message}", effect)
        stored = await self._store.get(effect.id, tx=tx)
        raise EffectFailedError(stored or dataclasses.replace(effect, error=error))

    @staticmethod
    def _lease_until(beat: Beat | None, opts: ResolvedRunOptions) -> float:
        """Until when (loop time) the lease surely keeps others off the effect."""
        if beat is None:
            # No takeover possible (after_ms=0), or inside a transaction (no
            # retries there): retry as long as a default lease would last.
            return lease_end(asyncio.get_running_loop().time(), DEFAULT_STALE_AFTER_MS)
        return lease_end(beat.confirmed_at, opts.stale_after_ms)

    @classmethod
    def _stop_beat(cls, beat: Beat | None, opts: ResolvedRunOptions) -> float:
        """Stop heartbeating; return until when the lease keeps others off the effect."""
        if beat is not None:
            beat.stop()
        return cls._lease_until(beat, opts)

    async def record(
        self,
        effect: Effect,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None,
        retry_until: float,
        *,
        maybe_landed: bool = False,
        ends_try: bool = True,
        usage_json: str | None = None,
        started: bool = True,
    ) -> bool:
        """Record a handler's outcome; True if this attempt's commit won.

        Store errors are retried on the ``COMMIT_RETRY`` schedule (at most a
        second apart) until ``retry_until``, the loop time at which this
        worker's lease may run out: the side effect has happened by now, and
        while the lease lasts nobody else can take the effect, so every retry
        that lands saves a second execution. Past it the last store error is
        raised: the effect stays processing, and the next caller takes it
        over once the lease has lapsed, as after a crash. ``ends_try`` is
        ``Store.commit``'s: False for an outcome no try of the handler
        produced. The compare-and-set is safe to repeat: if
        an earlier try landed before its connection broke, the retry matches
        no row and the stored effect shows our attempt and status, which
        counts as ours (``maybe_landed`` asks for that check from the first
        try, after an interrupted write). Inside a caller's transaction a
        failed statement aborts the transaction, so there is nothing to retry.
        """
        step = 0
        while True:
            try:
                won = await self._store.commit(
                    effect.id,
                    attempt=effect.attempt,
                    status=status,
                    result_json=result_json,
                    error=error,
                    tx=tx,
                    ends_try=ends_try,
                    usage_json=usage_json,
                    started=started,
                )
            except EffectStoreError:
                remaining_s = retry_until - asyncio.get_running_loop().time()
                if tx is not None or remaining_s <= 0:
                    raise
                delay = COMMIT_RETRY.delay(step, remaining_s=remaining_s)
                log_effect(
                    logging.WARNING,
                    f"recording the outcome failed; retrying in {delay:.2f} s",
                    effect,
                )
                await asyncio.sleep(delay)
                step += 1
                continue
            if not won and (step > 0 or maybe_landed):
                stored = await self._store.get(effect.id, tx=tx)
                # Our attempt and status, unless a person settled that attempt
                # (parked, then resolved with the same status): their outcome
                # is not ours, and every caller, us included, must get theirs.
                won = (
                    stored is not None
                    and stored.status is status
                    and stored.attempt == effect.attempt
                    and not was_parked(stored, effect.attempt)
                )
            if not won:
                log_effect(
                    logging.WARNING,
                    "commit rejected: another attempt or a decision got there first",
                    effect,
                )
            return won

    async def _record_landed(
        self,
        effect: Effect,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None,
        retry_until: float,
        *,
        ends_try: bool = True,
        usage_json: str | None = None,
        started: bool = True,
    ) -> bool:
        """``record``, carried through to the end even if this task is cancelled meanwhile.

        The handler has run by now: an outcome that is not recorded leaves the
        effect in processing, and once the lease lapses another caller runs it
        again. The write is awaited directly (no task on the hot path); if a
        cancellation interrupts it, it may or may not have landed, so a fresh
        write runs to the end in a task of its own (repeating it is safe:
        ``record`` reads back whether the interrupted one landed) and the
        cancellation propagates after it.
        """
        try:
            return await self.record(
                effect,
                status,
                result_json,
                error,
                tx,
                retry_until,
                ends_try=ends_try,
                usage_json=usage_json,
                started=started,
            )
        except asyncio.CancelledError as exc:
            interrupted = exc
        write = asyncio.ensure_future(
            self.record(
                effect,
                status,
                result_json,
                error,
                tx,
                retry_until,
                maybe_landed=True,
                ends_try=ends_try,
                usage_json=usage_json,
                started=started,
            )
        )
        while not write.done():
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                if write.cancelled():
                    raise  # the write itself was cancelled (the loop is closing)
            except Exception:
                pass  # the write's own error: logged below
        if not write.cancelled() and write.exception() is not None:
            logger.error(
                "recording the outcome failed while the run was being cancelled",
                exc_info=write.exception(),
                extra=effect_fields(effect),
            )
        raise interrupted

    async def _record_abandoned(
        self,
        effect: Effect,
        exc: BaseException,
        tx: object | None,
        retry_until: float,
        *,
        after_try: int | None = None,
        ends_try: bool = True,
    ) -> None:
        """Record a run cancelled while its handler ran, or (``after_try``) while it
        waited to retry after that try, whose end is recorded already."""
        if after_try is None:
            message = CANCELLED_WHILE_RUNNING.format(exc=type(exc).__name__)
        else:
            message = CANCELLED_BEFORE_RETRY.format(exc=type(exc).__name__, n=after_try)
            ends_try = False
        error = EffectError(message=message, code="cancelled")
        try:
            await self._record_landed(
                effect, EffectStatus.CANCELED, None, error, tx, retry_until, ends_try=ends_try
            )
        except Exception:
            logger.exception(
                "could not record the cancelled run; the effect stays processing until "
                "its stale window passes",
                extra=effect_fields(effect),
            )

    # -- manual commit -------------------------------------------------------------------

    async def commit(
        self, effect_id: str, outcome: CommitOutcome, *, attempt: int | None, tx: object | None
    ) -> bool:
        """``EffectLedger.commit``: check the outcome, then one fenced compare-and-set."""
        require_str(effect_id, "effect_id")
        await self.schema.ensure(tx)
        if attempt is not None and (type(attempt) is not int or attempt < 1):
            raise EffectLedgerValidationError(
                f"attempt must be a positive int, got {attempt!r}", field="attempt"
            )
        usage_json = None
        if isinstance(outcome, CommitSucceeded):
            result_json = canonical_json(outcome.result, field="result", sort_keys=False).decode()
            status, error = EffectStatus.SUCCEEDED, None
            if outcome.usage is not None:
                if not isinstance(outcome.usage, Usage):
                    raise EffectLedgerValidationError(
                        f"CommitSucceeded.usage must be a Usage or None, got {outcome.usage!r}",
                        field="usage",
                    )
                usage_json = usage_to_json(outcome.usage)
        elif isinstance(outcome, CommitFailed) and isinstance(outcome.error, EffectError):
            result_json, status, error = None, EffectStatus.FAILED, outcome.error
        else:
            raise EffectLedgerValidationError(
                "outcome must be CommitSucceeded(result=...) or "
                f"CommitFailed(error=EffectError(...)), got {outcome!r}",
                field="outcome",
            )
        return await self._store.commit(
            effect_id,
            attempt=attempt,
            status=status,
            result_json=result_json,
            error=error,
            tx=tx,
            usage_json=usage_json,
        )


def recorded_outcome(acquired: Acquired) -> object:
    """The outcome a caller gets for an effect someone else finished.

    A result that other waiters received too (a shared poll) is copied, so
    no caller can mutate another's.
    """
    effect = acquired.effect
    status = effect.status
    if status is EffectStatus.SUCCEEDED:
        result = effect.result
        if acquired.shared and isinstance(result, dict | list):
            return orjson.loads(orjson.dumps(result))
        return result
    if is_handler_timeout(effect):
        raise HandlerTimeoutError(effect)  # failed or canceled: the same error as the first call
    if status is EffectStatus.FAILED:
        raise EffectFailedError(effect)
    if status is EffectStatus.DENIED or status is EffectStatus.CANCELED:
        raise EffectDeniedError(effect)
    raise EffectLedgerInvariantError(f"no recorded outcome for a {status.value} effect")


def lease_end(alive_at: float, lease_ms: int) -> float:
    """The loop time until which a lease renewed at ``alive_at`` surely holds.

    ``alive_at`` is when the last heartbeat the store confirmed was sent (or
    the claim was made): the store's ``heartbeat_at`` is no earlier, so others
    may take over only ``lease_ms`` after it. A tenth of the lease, at most a
    second, is kept in hand for clocks and round trips.
    """
    lease_s = lease_ms / 1000.0
    return alive_at + lease_s - min(lease_s / 10.0, 1.0)


def takeovers(effect: Effect) -> int:
    """How often ``effect`` was taken over from a holder that stopped heartbeating.

    Every execution but the first began with a takeover, or with a person's
    approval of a parked run: the only ways into ``processing`` are the
    insert, the claim of an approved effect (before any run, or after a
    park: the history counts those), a takeover, and the claim of a
    released effect (a release takes back the execution its own claim
    added, so the counts still hold).
    """
    parks = sum(1 for event in effect.history if isinstance(event, Parked))
    return max(effect.executions - 1 - parks, 0)


def was_parked(effect: Effect, attempt: int) -> bool:
    """Whether ``attempt`` of ``effect`` was parked for a person (whose decision, not
    that attempt's commit, then settled it)."""
    return any(isinstance(e, Parked) and e.attempt == attempt for e in effect.history)


def _created_to_run(begun: BeginOutcome) -> Effect | None:
    """The effect a begin made ours: inserted as processing (not waiting for a person)."""
    effect = begun.effect
    return effect if begun.created and effect.status is EffectStatus.PROCESSING else None


def _policy_says_yes(policy: Callable[[ToolCall], object], call: ToolCall) -> bool:
    answer = policy(call)
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()  # never awaited: no "was never awaited" warning
        raise EffectLedgerValidationError(
            "requires_approval must be a plain function returning a bool; it returned an "
            "awaitable (an async def?), which would read as True for every call",
            field="requires_approval",
        )
    return bool(answer)


#: Where plain (sync) handlers run: a pool of the engine's own rather than the
#: event loop's default executor (a handful of threads), so a sync tool that
#: blocks on another tool's ``.sync()`` (which needs a thread for its own
#: handler) does not starve the pool with a few such calls at once.
HANDLER_THREADS: Final = 64
_handler_pool: ThreadPoolExecutor | None = None
_handler_pool_lock = threading.Lock()


def _handler_threads() -> ThreadPoolExecutor:
    global _handler_pool
    if _handler_pool is None:
        with _handler_pool_lock:
            if _handler_pool is None:
                _handler_pool = ThreadPoolExecutor(
                    max_workers=HANDLER_THREADS, thread_name_prefix="agent-ledger-handler"
                )
    return _handler_pool


async def _in_handler_thread(handler: Callable[[Effect], object], effect: Effect) -> object:
    """``asyncio.to_thread`` on the handler pool: the caller's context goes along."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        _handler_threads(), functools.partial(context.run, _call_in_thread, handler, effect)
    )


async def _start(
    handler: Callable[[Effect], object], effect: Effect, opts: ResolvedRunOptions
) -> object:
    """Call the handler the way ``execute`` does, without awaiting what it returns
    (``deadline.within`` awaits that until the deadline)."""
    if opts.sync_in_thread and not inspect.iscoroutinefunction(handler):
        return await _in_handler_thread(handler, effect)
    return handler(effect)


def _call_in_thread(handler: Callable[[Effect], object], effect: Effect) -> object:
    try:
        return handler(effect)
    except StopIteration as exc:
        # A StopIteration cannot cross into an asyncio future (the await would
        # hang); like PEP 479 does for coroutines, make it a RuntimeError.
        raise RuntimeError(f"handler raised StopIteration: {exc!r}") from exc


def _usage_json(usage: object) -> str:
    """``usage`` as the text its column keeps, or ``EffectLedgerValidationError``
    (field ``usage``) when it is not a ``Usage`` or cannot be encoded."""
    if not isinstance(usage, Usage):
        raise EffectLedgerValidationError(
            f"the handler's usage must be a Usage, got {type(usage).__name__}", field="usage"
        )
    try:
        text = usage_to_json(usage)
    except Exception as exc:
        raise EffectLedgerValidationError(
            f"the handler's usage could not be stored: {exc}", field="usage"
        ) from exc
    assert text is not None
    return text


def _failure_of(exc: Exception) -> tuple[EffectError, str | None, Exception]:
    """What to record for a handler's exception (the error, and the usage a
    ``FailedWithUsage`` carries), and what to raise once it is recorded."""
    if type(exc) is not FailedWithUsage:
        return _error_of(exc), None, exc
    try:
        usage_json: str | None = _usage_json(exc.usage)
    except EffectLedgerValidationError:
        usage_json = None
    return _error_of(exc.cause), usage_json, exc.cause


def _error_of(exc: BaseException) -> EffectError:
    """The ``EffectError`` to record for a handler's exception, whatever it does.

    A broken ``__str__`` or ``code`` must not stop the failure from being
    recorded: the effect would stay processing and be run again.
    """
    try:
        message = str(exc) or type(exc).__name__
    except Exception:
        message = f"{type(exc).__name__} (its message could not be read)"
    try:
        code = _error_code(exc)
    except Exception:
        code = type(exc).__name__
    return EffectError(message=message, code=code)


def _type_name(exc: BaseException) -> str:
    """The exception's class, qualified by its module unless it is a builtin."""
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _error_code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if code is None or isinstance(code, bool):
        return type(exc).__name__
    return code if isinstance(code, str) else str(code)
