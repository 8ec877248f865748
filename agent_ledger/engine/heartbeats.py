"""Keeping running effects alive: one heartbeat task per ledger, one batch per tick.

A handler that runs longer than its stale window must keep refreshing its
effect's ``heartbeat_at``, or another caller would take it over. Almost no
handler lives that long, so per-run timers or tasks would be pure overhead
on the hot path. Instead each ledger keeps a set of running handlers
(adding and removing one costs a set operation) and a single background task
that sleeps until the earliest one is due, then sends *one* batch
(``Store.heartbeat``) with every beat that is due or nearly due. The task is
started only when a beat falls due: the first beat arms one timer
(``loop.call_at``) at its due time, and almost every handler returns before
it fires, which then finds nothing to do. A caller making calls one after
another therefore pays a set operation per call, not a task (and a turn of
the event loop) each; and when no handler runs the task exits at once, so
nothing is left pending when an application closes its loop (a timer is
dropped silently; a pending task is reported as destroyed).

One batch per tick, rather than one call per effect, is what keeps
heartbeats out of the application's way: a SQL store answers it with one
statement, and PostgresStore sends it on a connection reserved for it, so a
handler that holds every connection of the application's pool cannot starve
the heartbeats of the effects it runs (issue 10, item 9).

Ticks are shared (:func:`due_beats`): a tick also takes every beat due within
half of its own interval, so beats with different stale windows, or started
at different moments, fall into step and ride in the same statement. Sending
a beat early only refreshes the lease sooner; it is never late.

A lease that is not an effect's (a saga's owner, say) is kept the same way
(:meth:`Heartbeats.keep`): its beat renews it with a call of its own, and
``lost`` turns True when that call says it is no longer held. Sagas, above
the engine, keep their owner alive with it rather than with a second
implementation.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from agent_ledger.effects import Effect
from agent_ledger.observability import effect_fields, logger
from agent_ledger.stores.base import Held, Store

__all__ = ["BEATS_PER_WINDOW", "EARLY_FRACTION", "Beat", "Heartbeats", "due_beats"]

#: Beats per stale window: a worker must miss this many before it looks dead.
BEATS_PER_WINDOW: Final = 3
#: How early, as a fraction of its own interval, a beat may join a tick that
#: goes out anyway.
EARLY_FRACTION: Final = 0.5
#: The shortest time a batch is given to land before it is abandoned (and
#: sent again, on a fresh connection, by the next tick).
MIN_SEND_BOUND_S: Final = 1.0


class Beat:
    """One running handler's entry; ``stop()`` it when the handler returns.

    Times are the event loop's clock (``loop.time()``).
    """

    __slots__ = ("_owner", "confirmed_at", "due", "effect", "interval_s", "lost", "renew", "what")

    def __init__(
        self,
        owner: Heartbeats,
        effect: Effect | None,
        interval_s: float,
        now: float,
        renew: Callable[[], Awaitable[bool]] | None = None,
        what: str = "",
    ) -> None:
        self._owner = owner
        #: The effect kept alive; None for a lease that ``renew`` keeps.
        self.effect = effect
        #: Renews a lease that is not an effect's: True while it is still held.
        self.renew = renew
        #: What the lease is, for the log (an effect's beat names its effect).
        self.what = what
        self.interval_s = interval_s
        #: When the next heartbeat must go out at the latest.
        self.due = now + interval_s
        #: When the last heartbeat the store confirmed for this effect was
        #: *sent* (at first: when the beat started, just after the claim).
        #: The store wrote ``heartbeat_at`` no earlier than that, so the lease
        #: lasts at least until ``confirmed_at`` plus the stale window.
        self.confirmed_at = now
        #: The store said the effect is no longer held (taken over, canceled):
        #: a retrying run must not start another try.
        self.lost = False

    @property
    def held(self) -> Held:
        """What a heartbeat for this beat names (built when one is sent: most
        handlers end before their first)."""
        assert self.effect is not None
        return Held(self.effect.id, self.effect.attempt)

    def stop(self) -> None:
        self._owner.forget(self)


def due_beats(beats: Iterable[Beat], now: float) -> list[Beat]:
    """The beats a tick at ``now`` sends: each one due, or due within
    ``EARLY_FRACTION`` of its interval."""
    return [b for b in beats if b.due - b.interval_s * EARLY_FRACTION <= now]


class Heartbeats:
    """The running handlers of one ledger, and the task that keeps them alive."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._running: set[Beat] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._next_due = float("inf")
        #: Armed while no task runs: starts one when the earliest beat falls due.
        self._timer: asyncio.TimerHandle | None = None

    def start(
        self, effect: Effect, stale_after_ms: int, loop: asyncio.AbstractEventLoop | None = None
    ) -> Beat:
        """Keep ``effect`` alive until the returned beat is stopped.

        ``loop``: the running loop, when the caller has it at hand. On Python
        3.11 ``asyncio.get_running_loop()`` checks the process id with a
        ``getpid()`` system call, which costs more than the rest of this.
        """
        if loop is None:
            loop = asyncio.get_running_loop()
        beat = Beat(self, effect, stale_after_ms / 1000.0 / BEATS_PER_WINDOW, loop.time())
        return self._add(beat, loop)

    def keep(self, renew: Callable[[], Awaitable[bool]], lease_ms: int, *, what: str) -> Beat:
        """Keep a lease that is not an effect's alive until the returned beat is
        stopped: ``renew()`` is called once per beat (a third of ``lease_ms``),
        and returns False once the lease is no longer held (the beat is then
        ``lost`` and stops). ``what`` names the lease in the log."""
        loop = asyncio.get_running_loop()
        interval_s = lease_ms / 1000.0 / BEATS_PER_WINDOW
        return self._add(Beat(self, None, interval_s, loop.time(), renew, what), loop)

    def _add(self, beat: Beat, loop: asyncio.AbstractEventLoop) -> Beat:
        self._running.add(beat)
        if self._loop is not loop:
            # First run on this loop (a ledger may outlive an event loop).
            self._loop, self._task = loop, None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._task is not None:
            if beat.due < self._next_due:
                assert self._wake is not None
                self._wake.set()
            return beat
        timer = self._timer
        if timer is None or beat.due < timer.when():
            if timer is not None:
                timer.cancel()
            # An empty context: the first beat may start inside a store
            # transaction's block (run(..., tx=tx)), whose mark the timer and
            # the task would inherit; the batch must wait for the transaction
            # like any worker's, not be refused as a step of its block.
            self._timer = loop.call_at(
                beat.due, self._fall_due, loop, context=contextvars.Context()
            )
        return beat

    def _fall_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer fired: start the task if a handler still runs."""
        self._timer = None
        if self._running and self._task is None and self._loop is loop:
            self._wake = asyncio.Event()
            self._next_due = float("inf")
            self._task = loop.create_task(self._run(loop), context=contextvars.Context())

    def forget(self, beat: Beat) -> None:
        """Stop beating for ``beat`` (its handler returned, or it lost the effect)."""
        running = self._running
        running.discard(beat)
        if not running and self._task is not None:
            # The last one: the task ends now rather than at its next tick.
            assert self._wake is not None
            self._wake.set()

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        wake = self._wake
        assert wake is not None
        try:
            # Ends as soon as no handler runs (``forget`` wakes it for that): a
            # beat started later arms a timer again (see ``start``). No await
            # lies between the last check and the end.
            while self._running:
                now = loop.time()
                batch = due_beats(self._running, now)
                if batch:
                    # Awaited here, not in a task of its own: one batch at a time
                    # is the point, and the next tick is computed once it is back.
                    await self._send(batch, now)
                    continue
                self._next_due = min(b.due for b in self._running)
                wake.clear()
                try:
                    async with asyncio.timeout(max(self._next_due - loop.time(), 0.0)):
                        await wake.wait()
                except TimeoutError:
                    pass
        finally:
            self._next_due = float("inf")
            if self._task is asyncio.current_task():
                self._task = None

    async def _send(self, due: list[Beat], sent_at: float) -> None:
        """One heartbeat for every beat of ``due``; stop the ones no longer held."""
        for beat in due:
            beat.due = sent_at + beat.interval_s
        # A batch that has not landed by the time the next one is due is
        # abandoned: the store drops a connection left mid-statement, and the
        # next tick tries again rather than waiting on a dead link.
        bound_s = max(min(b.interval_s for b in due), MIN_SEND_BOUND_S)
        for beat in due:
            if beat.renew is not None:
                await self._renew(beat, sent_at, bound_s)
        batch = [(b, b.effect) for b in due if b.effect is not None]
        if not batch:
            return
        try:
            async with asyncio.timeout(bound_s):
                outcome = await self._store.heartbeat([b.held for b, _ in batch])
        except Exception:
            # A transient store error must not kill healthy handlers: the next
            # tick retries, and the stale window is three beats long.
            logger.warning(
                "heartbeat for %d running effect(s) failed; retrying at the next tick",
                len(batch),
                exc_info=True,
                extra=effect_fields(batch[0][1]) if len(batch) == 1 else None,
            )
            return
        for beat, effect in batch:
            held = beat.held
            if held in outcome.refreshed:
                beat.confirmed_at = sent_at
            elif held not in outcome.busy and beat in self._running:
                beat.lost = True
                beat.stop()  # taken over or canceled: no point beating for it any more
                logger.warning(
                    "lost the effect while its handler runs (taken over or canceled); "
                    "this attempt's commit will be rejected: %s",
                    effect.tool,
                    extra=effect_fields(effect),
                )

    async def _renew(self, beat: Beat, sent_at: float, bound_s: float) -> None:
        """One heartbeat for a lease that is not an effect's (see :meth:`keep`)."""
        assert beat.renew is not None
        try:
            async with asyncio.timeout(bound_s):
                held = await beat.renew()
        except Exception:
            logger.warning(
                "%s: heartbeat failed; retrying at the next tick", beat.what, exc_info=True
            )
            return
        if held:
            beat.confirmed_at = sent_at
        elif beat in self._running:
            beat.lost = True
            beat.stop()
