"""An effect's life in one caller: prepare, acquire, execute, record.

:class:`Engine` composes the steps, each in a module of its own:

* **prepare** (``preparing``) checks the call and options and computes the
  key, before anything is stored (bad input stores nothing);
* **acquire** (``acquiring``) inserts the effect or finds it; a caller that
  created it owns it, any other waits (``waiting``) until it may claim it or
  it ends;
* **execute** (here) runs the handler of an owned effect (``handlers``,
  the one ``call_handler``), with heartbeats, and with a retry policy tries
  again between its tries (``retrying``);
* **record** (``recording``) commits the outcome, fenced by the attempt,
  retrying store errors on the ``backoff.COMMIT_RETRY`` schedule until the
  lease runs out, carried through a cancellation of the run.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from types import CoroutineType

from agent_ledger.context import current_outcome_slot
from agent_ledger.effects import (
    BeginResult,
    CommitFailed,
    CommitOutcome,
    CommitSucceeded,
    Effect,
    EffectError,
    Usage,
    usage_to_json,
)
from agent_ledger.engine.acquiring import Acquirer
from agent_ledger.engine.handlers import HANDLER_THREADS, call_handler, called_inline
from agent_ledger.engine.heartbeats import Heartbeats
from agent_ledger.engine.leases import lease_end
from agent_ledger.engine.legacy_keys import follow_legacy_key
from agent_ledger.engine.outcomes import TOO_MANY_TAKEOVERS, recorded_outcome, takeovers
from agent_ledger.engine.parking import mark_started
from agent_ledger.engine.preparing import Prepared, Preparer
from agent_ledger.engine.recording import (
    CANCELLED_BEFORE_RETRY,
    CANCELLED_WHILE_RUNNING,
    LOST,
    RESULT_NOT_SERIALIZABLE,
    USAGE_NOT_SERIALIZABLE,
    Recorded,
    Recorder,
    was_parked,
)
from agent_ledger.engine.retrying import (
    RETRIES_RAN_OUT,
    RETRY_TIME_RAN_OUT,
    TRIES_USED_BEFORE,
    Retrier,
    retries,
)
from agent_ledger.engine.waiting import Acquired
from agent_ledger.errors import EffectLedgerValidationError, require_str
from agent_ledger.keys import canonical_json
from agent_ledger.metrics import commit_fenced, executed, recording
from agent_ledger.options import EffectLedgerOptions, LedgerHooks, ResolvedRunOptions
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import SchemaCheck, Store

__all__ = [
    "CANCELLED_BEFORE_RETRY",
    "CANCELLED_WHILE_RUNNING",
    "HANDLER_THREADS",
    "RESULT_NOT_SERIALIZABLE",
    "RETRIES_RAN_OUT",
    "RETRY_TIME_RAN_OUT",
    "TOO_MANY_TAKEOVERS",
    "TRIES_USED_BEFORE",
    "USAGE_NOT_SERIALIZABLE",
    "Acquired",
    "Engine",
    "Prepared",
    "lease_end",
    "recorded_outcome",
    "takeovers",
    "was_parked",
]


class Engine:
    """Runs effects for one ledger: at most one execution per idempotency key."""

    def __init__(self, options: EffectLedgerOptions) -> None:
        self._store: Store = options.store
        hooks = options.hooks if options.hooks is not None else LedgerHooks()
        self._preparer = Preparer(options, hooks)
        #: Shared with decisions and audit: the schema is checked on first use.
        self.schema = SchemaCheck(self._store)
        self._heartbeats = Heartbeats(self._store)
        self._recorder = Recorder(self._store)
        self._acquirer = Acquirer(self._store, self.schema, self._recorder)
        # Retries wait and keep their time budget by the ledger's clock, so
        # tests can run them on a ManualClock without sleeping.
        self._retrier = Retrier(self._store, self._recorder, options.clock, options.sleep)
        self.prepare = self._preparer.prepare
        self.run_options = self._preparer.run_options
        self.approval_policy = self._preparer.approval_policy
        self.idem_key = self._preparer.idem_key

    @property
    def hooks(self) -> LedgerHooks:
        """The ledger's hooks: a call without its own uses these."""
        return self._preparer.hooks

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
        acquirer = self._acquirer
        # Tool.call_outcome's slot for this call, if it asked (one context read).
        slot = current_outcome_slot(prepared.new.idem_key)
        if prepared.legacy_key is not None:
            prepared = await follow_legacy_key(self._store, self.schema, prepared, tx)
        acquired = await acquirer.acquire(prepared, tx, loop)
        while acquired.owned:
            if slot is not None:
                slot.fill(acquired.effect, replayed=False)
            recorded = await self.execute(acquired.effect, handler, prepared.opts, tx, loop)
            if recorded.won:
                return recorded.value
            # Our commit lost to another attempt: the winner's outcome decides.
            acquired = await acquirer.wait(prepared, acquired.effect, tx)
        if slot is not None:
            slot.fill(acquired.effect, replayed=True)
        return recorded_outcome(acquired)

    async def begin(self, prepared: Prepared, tx: object | None) -> BeginResult[object]:
        """Acquire without a handler: the caller executes and commits."""
        acquirer = self._acquirer
        if prepared.legacy_key is not None:
            prepared = await follow_legacy_key(self._store, self.schema, prepared, tx)
        acquired = await acquirer.acquire(prepared, tx)
        while acquired.owned and prepared.opts.on_stale == "park":
            # The caller runs the tool as soon as this returns: its start is now.
            marked = await mark_started(self._store, acquired.effect, tx)
            if marked is not None:
                acquired = acquired._replace(effect=marked)
                break
            acquired = await acquirer.wait(prepared, acquired.effect, tx)
        if acquired.owned:
            executed(acquired.effect.tool)  # the caller runs the tool now
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

    # -- execute -------------------------------------------------------------------------

    async def execute(
        self,
        effect: Effect,
        handler: Callable[[Effect], object],
        opts: ResolvedRunOptions,
        tx: object | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Recorded:
        """Run the handler for an owned effect and record what happened.

        Returns the handler's value if our commit won, raises what the
        handler raised (after recording it), or returns a lost record when
        another attempt's commit won. With a retry policy, a retryable
        failure is recorded and the handler tried again (``retrying``).
        """
        policy = opts.retry
        if policy is not None and effect.tries >= policy.attempts:
            return await self._retrier.fail_used_up(effect, opts, tx)
        if opts.on_stale == "park":
            marked = await mark_started(self._store, effect, tx)
            if marked is None:
                # Taken over or canceled before the handler started: theirs to decide.
                return LOST
            effect = marked
        # Inside a transaction the row is invisible to other workers until
        # commit, so nobody can take it over and no heartbeat is needed.
        beat = (
            self._heartbeats.start(effect, opts.stale_after_ms, loop)
            if opts.stale_after_ms > 0 and tx is None
            else None
        )
        recorder, retrier = self._recorder, self._retrier
        inline = called_inline(handler, opts)
        first_try_at = retrier.started() if policy is not None else None
        # While waiting to retry: the number of the try that failed.
        after_try: int | None = None
        try:
            try:
                while True:
                    executed(effect.tool)
                    try:
                        if inline:
                            value = handler(effect)
                            if type(value) is CoroutineType or inspect.isawaitable(value):
                                value = await value
                        else:
                            value = await call_handler(handler, effect, opts)
                    except Exception as exc:
                        if first_try_at is None or not retries(policy, exc):
                            ended = functools.partial(recorder.failure, effect, exc)
                            break
                        failed = exc
                    else:
                        ended = functools.partial(recorder.value, effect, value)
                        break
                    # Outside the except block, so that a later try's exception is not
                    # chained to this one as if it had been raised while handling it.
                    after_try = effect.tries + 1
                    waited = await retrier.wait(effect, failed, opts, beat, first_try_at)
                    if waited is None:
                        return LOST
                    if isinstance(waited, EffectError):
                        ended = functools.partial(retrier.give_up, effect, waited, failed)
                        break
                    effect, after_try = waited, None
            except Exception:
                raise  # a store error between tries, past the lease: the lease decides
            except BaseException as stop:
                # CancelledError (and KeyboardInterrupt/SystemExit), while the
                # handler ran or while it waited to retry: record it, so the effect
                # does not sit in processing until the stale window.
                await recorder.abandoned(effect, stop, opts, tx, beat, after_try=after_try)
                raise
            # Recorded outside the loop's except blocks: a cancellation while the
            # outcome is being recorded is carried through there, not recorded again.
            return await ended(opts, tx, beat)
        finally:
            if beat is not None:
                beat.stop()  # on every way out (stopping twice is harmless)

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
            if type(outcome.retryable) is not bool:
                raise EffectLedgerValidationError(
                    f"CommitFailed.retryable must be a bool, got {outcome.retryable!r}",
                    field="retryable",
                )
        else:
            raise EffectLedgerValidationError(
                "outcome must be CommitSucceeded(result=...) or "
                f"CommitFailed(error=EffectError(...)), got {outcome!r}",
                field="outcome",
            )
        committed = await self._store.commit(
            effect_id,
            attempt=attempt,
            status=status,
            result_json=result_json,
            error=error,
            tx=tx,
            usage_json=usage_json,
            retryable=isinstance(outcome, CommitFailed) and outcome.retryable,
        )
        if not committed and recording():
            # Refused because another attempt or a decision holds it, not a
            # repeat of this attempt's own commit: read only to count it.
            stored = await self._store.get(effect_id, tx=tx)
            if stored is not None and (
                (attempt is not None and stored.attempt != attempt) or stored.status is not status
            ):
                commit_fenced(stored.tool)
        return committed
