"""Between a retry policy's tries: record the failed one, wait, check the effect is still ours.

Every try happens inside one claim, with the heartbeat going on through the
waits. Each failed try is recorded (``Store.record_try``, fenced by the
attempt) before the wait, so a worker that takes the effect over after a
crash continues the count; if the record is refused, the effect is no
longer ours (taken over, canceled) and its new owner decides. When the tries
(or the policy's time) run out, the effect is recorded failed with
``retries_exhausted`` and the last try's own exception is raised. Never
inside a caller's transaction (``run()`` refuses a retry policy there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final

from agent_ledger.codes import ErrorCode
from agent_ledger.effects import Effect, EffectError, FailedWithUsage, TryFailure
from agent_ledger.engine.handlers import error_of, type_name
from agent_ledger.engine.heartbeats import Beat
from agent_ledger.engine.leases import lease_end, lease_until, pause, stop_beat
from agent_ledger.engine.recording import (
    LOST,
    Outcome,
    Recorded,
    Recorder,
)
from agent_ledger.errors import EffectFailedError, EffectStoreError
from agent_ledger.observability import log_effect
from agent_ledger.options import ResolvedRunOptions
from agent_ledger.retries import RetryPolicy
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import Held, Store

__all__ = ["RETRIES_RAN_OUT", "RETRY_TIME_RAN_OUT", "TRIES_USED_BEFORE", "Retrier", "retries"]

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


def retries(policy: RetryPolicy | None, exc: Exception) -> bool:
    """Whether ``exc`` earns another try. Never a paid failure (``FailedWithUsage``):
    a retry would pay again."""
    return policy is not None and type(exc) is not FailedWithUsage and policy.retries(exc)


class Retrier:
    """The waits between tries, by the ledger's clock (a ``ManualClock`` in tests)."""

    def __init__(
        self,
        store: Store,
        recorder: Recorder,
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._store = store
        self._recorder = recorder
        self._clock = clock
        self._sleep = sleep

    def started(self) -> datetime:
        """The first try's start, from which a policy's ``timeout_ms`` counts."""
        return self._clock()

    async def wait(
        self,
        effect: Effect,
        exc: Exception,
        opts: ResolvedRunOptions,
        beat: Beat | None,
        first_try_at: datetime,
    ) -> Effect | EffectError | None:
        """After a retryable failure: record the try, wait, and check the effect is
        still ours. The effect to try again (its ``tries`` counting the one that
        failed with ``exc``), the error to give up with (``give_up``), or None
        when it is no longer ours. Raises a store error that outlasted the lease.
        """
        policy = opts.retry
        assert policy is not None
        return await self._wait(effect, effect.tries + 1, exc, opts, policy, beat, first_try_at)

    async def give_up(
        self,
        effect: Effect,
        error: EffectError,
        exc: Exception,
        opts: ResolvedRunOptions,
        tx: object | None,
        beat: Beat | None,
    ) -> Recorded:
        """No try may follow: record the effect failed with ``error``, then raise
        ``exc``, the last try's own exception, if the record is ours."""
        until = stop_beat(beat, opts)
        gave_up = Outcome(EffectStatus.FAILED, error=error, ends_try=False)
        if not await self._recorder.landed(effect, gave_up, tx, until):
            return LOST
        log_effect(logging.INFO, f"effect failed: {error.message}", effect)
        raise exc

    async def _wait(
        self,
        effect: Effect,
        tried: int,
        exc: Exception,
        opts: ResolvedRunOptions,
        policy: RetryPolicy,
        beat: Beat | None,
        first_try_at: datetime,
    ) -> Effect | EffectError | None:
        """Record try ``tried``, wait, check: the effect for the next try, the
        error to give up with, or None when it is no longer ours."""
        if not await self._record_try(effect, tried, exc, beat, opts):
            log_effect(
                logging.WARNING,
                f"try {tried} failed and could not be recorded: the effect was taken "
                "over or canceled meanwhile, so this worker stops trying",
                effect,
            )
            return None
        delay = policy.delay(tried, exc)
        gave_up = self._gave_up(policy, tried, exc, delay, first_try_at)
        if gave_up is not None:
            return gave_up
        log_effect(
            logging.INFO,
            f"try {tried} of {policy.attempts} failed ({error_of(exc)}); retrying in {delay:.3f} s",
            effect,
        )
        await self._sleep(delay)
        if not await self._still_held(effect, beat, opts):
            log_effect(logging.WARNING, "lost the effect while waiting to retry", effect)
            return None
        # The handler sees how many tries came before this one.
        return dataclasses.replace(effect, tries=tried)

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
            message = RETRIES_RAN_OUT.format(n=tried, limit=policy.attempts, error=error_of(exc))
            return EffectError(message=message, code=ErrorCode.RETRIES_EXHAUSTED)
        if policy.timeout_ms is None:
            return None
        next_at_ms = (self._clock() - first_try_at).total_seconds() * 1000.0 + delay * 1000.0
        if next_at_ms <= policy.timeout_ms:
            return None
        message = RETRY_TIME_RAN_OUT.format(
            n=tried, ms=next_at_ms, limit=policy.timeout_ms, error=error_of(exc)
        )
        return EffectError(message=message, code=ErrorCode.RETRIES_EXHAUSTED)

    async def _record_try(
        self,
        effect: Effect,
        tried: int,
        exc: BaseException,
        beat: Beat | None,
        opts: ResolvedRunOptions,
    ) -> bool:
        """``Store.record_try`` for failed try number ``tried``; True if it was recorded.

        Store errors are retried like a commit's (``Recorder.record``), on the
        ``COMMIT_RETRY`` schedule while the lease lasts, then raised. A
        repeat after a lost reply would count the try twice, so after an
        error the effect is read back first: still ours, with the count
        already at ``tried``, means the lost record landed.
        """
        error, error_type = error_of(exc), type_name(exc)
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
                until = lease_until(beat, opts)
                if not await pause(step, until, effect, f"recording try {tried}"):
                    raise
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
                until = lease_until(beat, opts)
                if not await pause(step, until, effect, "asking whether it is still held"):
                    return False
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

    async def fail_used_up(
        self, effect: Effect, opts: ResolvedRunOptions, tx: object | None
    ) -> Recorded:
        """Claimed an effect whose run already used every try (its last holder
        stopped before recording the outcome): record that, run nothing."""
        policy = opts.retry
        assert policy is not None
        last = next((e for e in reversed(effect.history) if isinstance(e, TryFailure)), None)
        last_error = "unknown" if last is None else str(EffectError(last.message, last.code))
        message = TRIES_USED_BEFORE.format(n=effect.tries, limit=policy.attempts, error=last_error)
        error = EffectError(message=message, code=ErrorCode.RETRIES_EXHAUSTED)
        until = lease_end(asyncio.get_running_loop().time(), opts.stale_after_ms)
        # started=False: no handler runs for this claim, so it is no execution.
        used_up = Outcome(EffectStatus.FAILED, error=error, ends_try=False, started=False)
        if not await self._recorder.landed(effect, used_up, tx, until):
            return LOST
        log_effect(logging.INFO, f"effect failed: {message}", effect)
        stored = await self._store.get(effect.id, tx=tx)
        raise EffectFailedError(stored or dataclasses.replace(effect, error=error))
