"""Keeping running effects alive: one heartbeat task per ledger, not one timer per run.

A handler that runs longer than its stale window must keep refreshing its
effect's ``heartbeat_at``, or another caller would take it over. Almost no
handler lives that long, so per-run timers or tasks would be pure overhead
on the hot path. Instead each ledger keeps a set of running handlers
(adding and removing one costs a set operation) and a single background task
that sleeps until the earliest one is due, beats every due effect
concurrently, and exits when the set is empty.
"""

from __future__ import annotations

import asyncio
from typing import Final

from agent_ledger.effects import Effect
from agent_ledger.observability import effect_fields, logger
from agent_ledger.stores.base import Store

__all__ = ["BEATS_PER_WINDOW", "Beat", "Heartbeats"]

#: Beats per stale window: a worker must miss this many before it looks dead.
BEATS_PER_WINDOW: Final = 3


class Beat:
    """One running handler's entry; ``stop()`` it when the handler returns."""

    __slots__ = ("_owner", "due", "effect", "interval_s")

    def __init__(self, owner: Heartbeats, effect: Effect, interval_s: float, due: float) -> None:
        self._owner = owner
        self.effect = effect
        self.interval_s = interval_s
        self.due = due

    def stop(self) -> None:
        self._owner.forget(self)


class Heartbeats:
    """The running handlers of one ledger, and the task that keeps them alive."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._running: set[Beat] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._next_due = float("inf")
        self._in_flight: set[asyncio.Task[None]] = set()

    def start(self, effect: Effect, stale_after_ms: int) -> Beat:
        """Keep ``effect`` alive until the returned beat is stopped."""
        loop = asyncio.get_running_loop()
        interval_s = stale_after_ms / 1000.0 / BEATS_PER_WINDOW
        beat = Beat(self, effect, interval_s, loop.time() + interval_s)
        self._running.add(beat)
        if self._task is None or self._task.done() or self._loop is not loop:
            # First run on this loop (a ledger may outlive an event loop).
            self._loop = loop
            self._wake = asyncio.Event()
            self._next_due = beat.due
            self._task = loop.create_task(self._run(loop))
        elif beat.due < self._next_due:
            assert self._wake is not None
            self._wake.set()
        return beat

    def forget(self, beat: Beat) -> None:
        """Stop beating for ``beat`` (its handler returned, or it lost the effect)."""
        self._running.discard(beat)

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        wake = self._wake
        assert wake is not None
        while self._running:
            now = loop.time()
            for beat in [b for b in self._running if b.due <= now]:
                beat.due = now + beat.interval_s
                task = loop.create_task(self._send(beat))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
            if not self._running:
                break
            self._next_due = min(b.due for b in self._running)
            wake.clear()
            try:
                async with asyncio.timeout(max(self._next_due - loop.time(), 0.0)):
                    await wake.wait()
            except TimeoutError:
                pass
        self._next_due = float("inf")

    async def _send(self, beat: Beat) -> None:
        effect = beat.effect
        try:
            alive = await self._store.heartbeat(effect.id, effect.attempt)
        except Exception:
            # A transient store error must not kill a healthy handler: the next
            # beat retries, and the stale window is three beats long.
            logger.warning("heartbeat failed; retrying", exc_info=True, extra=effect_fields(effect))
            return
        if not alive and beat in self._running:
            beat.stop()  # taken over or canceled: no point beating for it any more
            logger.warning(
                "lost the effect while its handler runs (taken over or canceled); "
                "this attempt's commit will be rejected: %s",
                effect.tool,
                extra=effect_fields(effect),
            )
