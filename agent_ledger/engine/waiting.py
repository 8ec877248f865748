"""Waiting for an effect someone else holds, or a person has to decide.

A waiter polls the store until the effect reaches an outcome or it may
claim it: approved (``ready``), or ``processing`` with a stale heartbeat (a
takeover). Notifications wake it early; polling is the fallback and the
only source of truth. Three questions are kept apart here:

* *may I claim it?* (:func:`claim_window`), from the status and the
  caller's stale window;
* *what does a failed poll mean?* (:meth:`Waiter._poll`): no news, unless
  it happened inside the caller's transaction, which it aborted;
* *how long may I still wait, and how long until the next poll?*
  (:class:`WaitBudget`): waiting for a worker and waiting for a person are
  separate phases, each with its own limit and a restarted backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, NamedTuple

from agent_ledger.backoff import LOCK_WAIT_SLICE_MS
from agent_ledger.effects import Effect
from agent_ledger.engine.cancellation import carry_through
from agent_ledger.engine.polling import SharedPolls
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectInFlightError,
    EffectLedgerInvariantError,
    EffectStoreError,
    EffectTimeoutError,
)
from agent_ledger.metrics import approval_entered, taken_over
from agent_ledger.observability import log_effect, logger
from agent_ledger.options import ResolvedConcurrency, ResolvedRunOptions
from agent_ledger.status import CLAIMABLE, EffectStatus
from agent_ledger.stores.base import Store

__all__ = ["Acquired", "WaitBudget", "Waiter", "claim_window", "parks_instead"]

_PROCESSING: Final = EffectStatus.PROCESSING
_READY: Final = EffectStatus.READY
_REQUIRES_APPROVAL: Final = EffectStatus.REQUIRES_APPROVAL


class Acquired(NamedTuple):
    """Where acquiring (or waiting) ended: owning the effect, or at its outcome."""

    effect: Effect
    owned: bool
    #: This caller created the effect (``begin`` reports it as ``fresh``).
    fresh: bool = False
    #: The effect came from another waiter's poll: copy its result before handing it out.
    shared: bool = False


class _Poll(NamedTuple):
    effect: Effect
    claimed: bool
    shared: bool
    #: The store error this poll hit; the effect is then the last one seen.
    error: EffectStoreError | None
    #: This poll parked the effect (an ambiguous attempt, see ``parking``).
    parked: bool = False
    #: Its claim waited out its bound on another transaction's lock on the row.
    locked: bool = False


def parks_instead(effect: Effect) -> bool:
    """Whether a stale holder of ``effect`` is parked rather than taken over: its
    current attempt's handler started under ``on_stale="park"``."""
    return effect.status is _PROCESSING and effect.park_attempt == effect.attempt


def claim_window(status: EffectStatus, stale_after_ms: int) -> int | None:
    """The stale window to claim with, or None when a poll should only read.

    ``ready`` is always claimable; ``processing`` only when takeover is on
    (``stale_after_ms > 0``), and then the store judges the heartbeat's age.
    """
    if status not in CLAIMABLE or (status is _PROCESSING and stale_after_ms <= 0):
        return None
    return stale_after_ms


class WaitBudget:
    """How long a waiter may still wait, and how long to sleep before its next poll.

    Waiting for a person and waiting for a worker are separate phases: when
    the phase changes (approved, now running elsewhere), the clock and the
    backoff start over, so a long approval does not eat the worker's budget.
    """

    __slots__ = ("_approval", "_concurrency", "_loop", "_since", "_started", "_step")

    def __init__(self, concurrency: ResolvedConcurrency, since: float | None = None) -> None:
        """``since``: when the caller began waiting for a worker (the loop's clock),
        if before this budget was made (its begin waited for another transaction's
        lock): the first worker phase counts from then."""
        self._concurrency = concurrency
        self._loop = asyncio.get_running_loop()
        self._approval: bool | None = None
        self._since = since
        self._started = 0.0
        self._step = 0

    def _phase(self, status: EffectStatus, now: float) -> int | None:
        """Enter the phase ``status`` belongs to, if not in it yet; its limit in ms."""
        c = self._concurrency
        approval = status is _REQUIRES_APPROVAL
        if approval is not self._approval:
            since = self._since if self._approval is None and not approval else None
            self._approval, self._started, self._step = approval, since or now, 0
        return c.approval_timeout_ms if approval else c.wait_timeout_ms

    def next_delay(
        self, idem_key: str, status: EffectStatus, poll_error: EffectStoreError | None
    ) -> float:
        """Seconds to sleep before the next poll; raises when the budget is spent.

        Past the limit, a waiter whose last poll failed raises that store
        error (the store, not the other caller, is the problem); otherwise
        ``EffectTimeoutError``.
        """
        c = self._concurrency
        now = self._loop.time()
        limit_ms = self._phase(status, now)
        waited_ms = (now - self._started) * 1000.0
        if limit_ms is not None and waited_ms >= limit_ms:
            if poll_error is not None:
                raise poll_error
            raise EffectTimeoutError(idem_key, status, waited_ms, limit_ms)
        remaining_s = None if limit_ms is None else (limit_ms - waited_ms) / 1000.0
        delay = c.polls.delay(self._step, remaining_s=remaining_s)
        self._step += 1
        return delay


class Waiter:
    """Waits on effects for one ledger; waiters on one key share their polls."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._polls = SharedPolls(store)

    async def wait(
        self,
        idem_key: str,
        effect: Effect,
        opts: ResolvedRunOptions,
        tx: object | None,
        on_parked: Callable[[Effect], Awaitable[None]] | None = None,
        since: float | None = None,
    ) -> Acquired:
        """Poll (woken early by notifications) until we own the effect or it ends.

        ``since``: when the caller began waiting (see :class:`WaitBudget`).
        A claim that meets another transaction's lock on the row waits for it
        at most a slice (``backoff.LOCK_WAIT_SLICE_MS``), and the poll then
        counts as no news.

        A holder that went silent after its handler started under
        ``on_stale="park"`` is parked instead of taken over; the caller whose
        poll parked it calls ``on_parked`` and, like every other, then waits
        for a person as for an approval. The page is sent at least once: it
        is carried through a cancellation of the caller, and a park whose
        reply was lost pages once the next poll shows it landed.
        """
        budget = WaitBudget(opts.concurrency, since)
        #: The attempt a park poll of ours may have parked though it failed
        #: (a lost reply): whether it landed is read on the next poll.
        unsure_park: int | None = None
        async with self._store.subscribe(idem_key) as changes:
            while True:
                # Polling after subscribing means no change between the
                # caller's last read and this wait can be missed.
                window = claim_window(effect.status, opts.stale_after_ms)
                park = window is not None and tx is None and parks_instead(effect)
                bound = None if window is None or tx is not None else LOCK_WAIT_SLICE_MS
                try:
                    poll = await self._poll(idem_key, effect, window, tx, park=park, bound=bound)
                except asyncio.CancelledError:
                    if park:
                        # The park was carried to its end, and may have landed:
                        # nobody else would page anyone about it.
                        await carry_through(
                            self._page_if_parked(idem_key, effect.attempt, on_parked)
                        )
                    raise
                if poll.parked:
                    approval_entered(poll.effect)  # our park won: counted once, here
                if poll.parked or (unsure_park == poll.effect.attempt and poll.effect.parked):
                    # Paged at least once: after a lost reply, a page may be
                    # sent twice (if another caller parked it meanwhile).
                    await carry_through(self._page(poll.effect, on_parked))
                if poll.error is None:
                    unsure_park = None
                elif park:
                    unsure_park = effect.attempt
                claimed_from = effect.status
                effect = poll.effect
                if poll.claimed:
                    if claimed_from is _PROCESSING:
                        taken_over(effect.tool)
                    # attempt 2+ from ready is an approval; from processing, a takeover.
                    log_effect(logging.INFO, f"claimed effect (attempt {effect.attempt})", effect)
                    return Acquired(effect, owned=True)
                if effect.status.is_terminal:
                    return Acquired(effect, owned=False, shared=poll.shared)
                if effect.status is _READY and poll.error is None and not poll.locked:
                    continue  # approved since we last looked: claim it now, not after a sleep
                if effect.status is _REQUIRES_APPROVAL and not opts.wait_for_approval:
                    raise ApprovalPendingError(effect)
                await changes.wait(budget.next_delay(idem_key, effect.status, poll.error))

    async def _poll(
        self,
        idem_key: str,
        last_seen: Effect,
        window: int | None,
        tx: object | None,
        *,
        park: bool,
        bound: int | None = None,
    ) -> _Poll:
        try:
            current, won, shared = await self._polls.poll(
                idem_key, claim_stale_after_ms=window, tx=tx, park=park, lock_timeout_ms=bound
            )
        except EffectInFlightError as exc:
            if exc.status is not None or tx is not None:
                raise
            # Another transaction holds the row (its claim of it, uncommitted):
            # no news, and no store error either; the budget decides.
            return _Poll(last_seen, claimed=False, shared=False, error=None, locked=True)
        except EffectStoreError as exc:
            # Waiting is retryable: a failed poll (a dropped connection, a
            # restarting server) is no news, and the next poll tries again.
            # Inside a transaction the error aborted it: give up.
            if tx is not None:
                raise
            log_effect(logging.WARNING, f"poll failed while waiting ({exc}); retrying", last_seen)
            return _Poll(last_seen, claimed=False, shared=False, error=exc)
        if current is None:
            raise EffectLedgerInvariantError(
                f"effect {idem_key} disappeared from the store while a caller waited on it"
            )
        return _Poll(current, won and not park, shared, None, parked=won and park)

    @staticmethod
    async def _page(effect: Effect, on_parked: Callable[[Effect], Awaitable[None]] | None) -> None:
        log_effect(
            logging.WARNING,
            f"effect parked: attempt {effect.attempt}'s worker went silent after "
            "its handler started (on_stale='park'); it waits for a person",
            effect,
        )
        if on_parked is not None:
            await on_parked(effect)

    async def _page_if_parked(
        self,
        idem_key: str,
        attempt: int,
        on_parked: Callable[[Effect], Awaitable[None]] | None,
    ) -> None:
        """Page about the effect if it is parked at ``attempt``: after a park of
        ours whose outcome we never saw (its caller was cancelled). A store error
        is logged: the caller's cancellation goes on, not this error."""
        try:
            current = await self._store.find(idem_key)
        except Exception:
            logger.error("paging about a parked effect failed", exc_info=True)
            return
        if current is not None and current.parked and current.attempt == attempt:
            await self._page(current, on_parked)
