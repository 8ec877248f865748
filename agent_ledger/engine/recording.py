"""Recording an owned effect's outcome: fenced, retried, and carried through cancellation.

Once a handler has run, its outcome must land: an outcome that is not
recorded leaves the effect in ``processing``, and once the lease lapses
another caller runs it again. So :meth:`Recorder.record` retries store
errors on the ``backoff.COMMIT_RETRY`` schedule while the lease lasts, and
:meth:`Recorder.landed` carries the write to its end even when the task is
cancelled meanwhile (``cancellation.carry_through``). The rest says *what*
to record: a value (a ``WithUsage`` one with its usage, a non-JSON one as a
failure), a failure, a handler that ran late, a run that was cancelled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Final, NamedTuple

from agent_ledger.codes import ErrorCode
from agent_ledger.context import current_outcome_slot
from agent_ledger.effects import Effect, EffectError, FailedWithUsage, Parked, WithUsage
from agent_ledger.engine.cancellation import carry_through
from agent_ledger.engine.deadline import Late, late_outcome
from agent_ledger.engine.handlers import failure_of, usage_json
from agent_ledger.engine.heartbeats import Beat
from agent_ledger.engine.leases import lease_end, lease_until, pause, stop_beat
from agent_ledger.engine.limits import cap_message
from agent_ledger.errors import EffectLedgerValidationError, EffectStoreError, HandlerTimeoutError
from agent_ledger.keys import canonical_json
from agent_ledger.metrics import commit_fenced
from agent_ledger.observability import effect_fields, log_effect, logger
from agent_ledger.options import ResolvedRunOptions
from agent_ledger.retries import failure_is_retryable
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import Store

__all__ = [
    "CANCELLED_BEFORE_RETRY",
    "CANCELLED_WHILE_RUNNING",
    "LOST",
    "RESULT_NOT_SERIALIZABLE",
    "RETRYABLE_NOTE",
    "USAGE_NOT_SERIALIZABLE",
    "Outcome",
    "Recorded",
    "Recorder",
    "lease_end",
    "lease_until",
    "pause",
    "stop_beat",
    "was_parked",
]

#: Error code recorded when a handler's return value is not JSON (an alias of
#: ``ErrorCode.RESULT_NOT_SERIALIZABLE``, kept for code that imports it from here).
RESULT_NOT_SERIALIZABLE: Final = ErrorCode.RESULT_NOT_SERIALIZABLE
#: The error code of a handler whose returned ``usage`` could not be recorded
#: (an alias of ``ErrorCode.USAGE_NOT_SERIALIZABLE``).
USAGE_NOT_SERIALIZABLE: Final = ErrorCode.USAGE_NOT_SERIALIZABLE
#: The note a retryable failure's exception carries to the caller that ran it.
RETRYABLE_NOTE: Final = (
    "agent-ledger: recorded as a retryable failure (effect {key}…): calling the tool again "
    "with the same arguments, in the same workflow and scope, runs it again"
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


class Outcome(NamedTuple):
    """What to commit for an owned effect: ``Store.commit``'s arguments."""

    status: EffectStatus
    result_json: str | None = None
    error: EffectError | None = None
    usage_json: str | None = None
    #: False for an outcome no try of the handler produced (see ``Store.commit``).
    ends_try: bool = True
    #: False when no handler started for this attempt at all (a claim the
    #: engine refused to run): ``Store.commit`` takes its execution back.
    started: bool = True
    #: A failure the tool declared retryable: the next call runs it again.
    retryable: bool = False


class Recorded(NamedTuple):
    """How executing an owned effect ended, when it did not raise."""

    #: False: another attempt's commit (or a decision) got there first.
    won: bool
    #: The handler's own return value, when ``won``.
    value: object = None


#: Another attempt's commit, or a decision, got there first: theirs decides.
LOST: Final = Recorded(won=False)


class Recorder:
    """Writes outcomes for one ledger's engine, through its store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def value(
        self,
        effect: Effect,
        value: object,
        opts: ResolvedRunOptions,
        tx: object | None,
        beat: Beat | None,
    ) -> Recorded:
        """Record the handler's return value as the outcome (a non-JSON one as a failure).

        A ``WithUsage`` value records its usage in the same commit and hands
        back only its ``result``. A value that cannot be stored fails the
        effect, once, and keeps the usage if that could be stored: a model
        call whose answer is not JSON was still paid for. A ``Late`` value
        (the handler ran past its deadline) goes to :meth:`late`.
        """
        if type(value) is Late:
            return await self.late(effect, value, opts, tx, beat)
        until = stop_beat(beat, opts)
        usage = None
        try:
            if type(value) is WithUsage:
                usage = usage_json(value.usage)
                value = value.result
            result_json = canonical_json(value, field="result", sort_keys=False).decode()
            self._check_size(result_json, usage)
        except EffectLedgerValidationError as exc:
            code = (
                ErrorCode.USAGE_NOT_SERIALIZABLE
                if exc.field == "usage"
                else ErrorCode.RESULT_TOO_LARGE
                if exc.field == "result_size"
                else ErrorCode.RESULT_NOT_SERIALIZABLE
            )
            if exc.field == "result_size":
                usage = None  # counted in the size: recorded with the result or not at all
            error = EffectError(message=str(exc), code=code)
            failed = Outcome(EffectStatus.FAILED, error=error, usage_json=usage)
            if await self.landed(effect, failed, tx, until):
                raise
            return LOST
        succeeded = Outcome(EffectStatus.SUCCEEDED, result_json, usage_json=usage)
        if await self.landed(effect, succeeded, tx, until):
            log_effect(logging.DEBUG, "effect succeeded", effect)
            return Recorded(won=True, value=value)
        return LOST

    def _check_size(self, result_json: str, usage: str | None) -> None:
        """Refuse a result (with its usage) bigger than the store holds
        (``max_result_bytes``, a store's optional attribute; engine.limits)."""
        limit = getattr(self._store, "max_result_bytes", None)
        if limit is None:
            return
        size = len(result_json.encode()) + (len(usage.encode()) if usage else 0)
        if size > limit:
            raise EffectLedgerValidationError(
                f"the handler's result is {size} bytes of JSON, more than this store holds "
                f"({limit}); recorded as failed (code result_too_large): the side effect "
                "happened, so return less (an id to fetch the rest by)",
                field="result_size",
            )

    async def failure(
        self,
        effect: Effect,
        exc: Exception,
        opts: ResolvedRunOptions,
        tx: object | None,
        beat: Beat | None,
    ) -> Recorded:
        """Record the handler's exception as the outcome; raise it if the record is
        ours (a ``FailedWithUsage``'s cause, with its usage recorded)."""
        until = stop_beat(beat, opts)
        error, usage, raised = failure_of(exc)
        retryable = failure_is_retryable(raised, opts.retryable)
        if not await self.landed(
            effect,
            Outcome(EffectStatus.FAILED, None, error, usage, retryable=retryable),
            tx,
            until,
        ):
            return LOST
        log_effect(
            logging.INFO, "effect failed (retryable)" if retryable else "effect failed", effect
        )
        slot = current_outcome_slot(effect.idem_key)
        if slot is not None:
            slot.error, slot.retryable = raised, retryable
        if retryable:
            raised.add_note(RETRYABLE_NOTE.format(key=effect.idem_key[:12]))
        if raised is exc:
            raise exc
        raise raised from raised.__cause__

    async def late(
        self,
        effect: Effect,
        late: Late,
        opts: ResolvedRunOptions,
        tx: object | None,
        beat: Beat | None,
    ) -> Recorded:
        """Record a handler that ran past its deadline (see ``deadline``); raise
        ``HandlerTimeoutError`` if the record is ours. Never retried."""
        assert opts.timeout_ms is not None
        until = stop_beat(beat, opts)
        usage = None
        try:
            if type(late.value) is WithUsage:  # a model call that answered late still cost
                usage = usage_json(late.value.usage)
            elif type(late.exc) is FailedWithUsage:
                usage = usage_json(late.exc.usage)
        except EffectLedgerValidationError:
            usage = None  # the late outcome is recorded all the same
        if type(late.value) is WithUsage:
            late = late._replace(value=late.value.result)
        status, result_json, error = late_outcome(late, opts.timeout_ms)
        if not await self.landed(effect, Outcome(status, result_json, error, usage), tx, until):
            return LOST
        log_effect(logging.WARNING, f"handler timed out: {error.message}", effect)
        recorded = dataclasses.replace(effect, status=status, error=error)
        timed_out = HandlerTimeoutError(recorded)
        slot = current_outcome_slot(effect.idem_key)
        if slot is not None:
            slot.error = timed_out
        raise timed_out from late.exc

    async def abandoned(
        self,
        effect: Effect,
        exc: BaseException,
        opts: ResolvedRunOptions,
        tx: object | None,
        beat: Beat | None,
        *,
        after_try: int | None = None,
    ) -> None:
        """Record a run cancelled while its handler ran, or (``after_try``) while it
        waited to retry after that try, whose end is recorded already.

        For ``CancelledError`` (and ``KeyboardInterrupt``, ``SystemExit``): the
        effect must not sit in processing until the stale window passes."""
        until = stop_beat(beat, opts)
        if after_try is None:
            message = CANCELLED_WHILE_RUNNING.format(exc=type(exc).__name__)
        else:
            message = CANCELLED_BEFORE_RETRY.format(exc=type(exc).__name__, n=after_try)
        error = EffectError(message=message, code=ErrorCode.RUN_CANCELLED)
        try:
            cancelled = Outcome(EffectStatus.CANCELED, error=error, ends_try=after_try is None)
            await self.landed(effect, cancelled, tx, until)
        except Exception:
            logger.exception(
                "could not record the cancelled run; the effect stays processing until "
                "its stale window passes",
                extra=effect_fields(effect),
            )

    async def landed(
        self, effect: Effect, outcome: Outcome, tx: object | None, retry_until: float
    ) -> bool:
        """:meth:`record`, carried through to the end even if this task is cancelled meanwhile.

        The handler has run by now: an outcome that is not recorded leaves the
        effect in processing, and once the lease lapses another caller runs it
        again. The write is awaited directly (no task on the hot path); if a
        cancellation interrupts it, it may or may not have landed, so a fresh
        write runs to the end in a task of its own (repeating it is safe:
        ``record`` reads back whether the interrupted one landed) and the
        cancellation propagates after it.
        """
        try:
            return await self.record(effect, outcome, tx, retry_until)
        except asyncio.CancelledError as exc:
            interrupted = exc
        try:
            await carry_through(self.record(effect, outcome, tx, retry_until, maybe_landed=True))
        except Exception as failed:
            logger.error(
                "recording the outcome failed while the run was being cancelled",
                exc_info=failed,
                extra=effect_fields(effect),
            )
        raise interrupted

    async def record(
        self,
        effect: Effect,
        outcome: Outcome,
        tx: object | None,
        retry_until: float,
        *,
        maybe_landed: bool = False,
    ) -> bool:
        """Record a handler's outcome; True if this attempt's commit won.

        Store errors are retried on the ``COMMIT_RETRY`` schedule (at most a
        second apart) until ``retry_until``, the loop time at which this
        worker's lease may run out: the side effect has happened by now, and
        while the lease lasts nobody else can take the effect, so every retry
        that lands saves a second execution. Past it the last store error is
        raised: the effect stays processing, and the next caller takes it
        over once the lease has lapsed, as after a crash. The
        compare-and-set is safe to repeat: if
        an earlier try landed before its connection broke, the retry matches
        no row and the stored effect shows our attempt and status, which
        counts as ours (``maybe_landed`` asks for that check from the first
        try, after an interrupted write). Inside a caller's transaction a
        failed statement aborts the transaction, so there is nothing to retry.
        """
        step = 0
        substituted, refused = False, None
        while True:
            try:
                won = await self._store.commit(
                    effect.id,
                    attempt=effect.attempt,
                    status=outcome.status,
                    result_json=outcome.result_json,
                    error=outcome.error,
                    tx=tx,
                    ends_try=outcome.ends_try,
                    usage_json=outcome.usage_json,
                    started=outcome.started,
                    retryable=outcome.retryable,
                )
            except EffectStoreError as exc:
                if exc.too_long and not substituted and tx is None:
                    # The store refused this outcome as too long: it would fail
                    # every retry, and the effect would be run again after the
                    # lease. Record a small failure that says so instead.
                    substituted, refused = True, exc
                    outcome = not_stored(outcome, exc)
                    continue
                # Inside a caller's transaction the failed statement aborted it.
                if tx is not None or not await pause(
                    step, retry_until, effect, "recording the outcome"
                ):
                    raise
                step += 1
                continue
            if not won and (step > 0 or maybe_landed):
                stored = await self._store.get(effect.id, tx=tx)
                # Our attempt and status, unless a person settled that attempt
                # (parked, then resolved with the same status): their outcome
                # is not ours, and every caller, us included, must get theirs.
                won = (
                    stored is not None
                    and stored.status is outcome.status
                    and stored.attempt == effect.attempt
                    and not was_parked(stored, effect.attempt)
                )
            if not won:
                commit_fenced(effect.tool)
                log_effect(
                    logging.WARNING,
                    "commit rejected: another attempt or a decision got there first",
                    effect,
                )
            elif refused is not None:
                assert outcome.error is not None
                raise EffectLedgerValidationError(
                    outcome.error.message, field="outcome"
                ) from refused
            return won


def not_stored(outcome: Outcome, refused: EffectStoreError) -> Outcome:
    """What to record instead of an outcome the store refused as too long."""
    error = EffectError(
        message=cap_message(
            f"the handler's outcome ({outcome.status.value}) could not be stored: {refused}; "
            "the side effect happened"
        ),
        code=ErrorCode.OUTCOME_NOT_STORED,
    )
    return outcome._replace(
        status=EffectStatus.FAILED, result_json=None, error=error, usage_json=None, retryable=False
    )


def was_parked(effect: Effect, attempt: int) -> bool:
    """Whether ``attempt`` of ``effect`` was parked for a person (whose decision, not
    that attempt's commit, then settled it)."""
    return any(isinstance(e, Parked) and e.attempt == attempt for e in effect.history)
