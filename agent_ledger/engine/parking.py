"""Runs under ``on_stale="park"``: record the handler's start, and park a silent holder.

Under ``take_over`` (the default) a holder that goes silent for its lease is
taken over and its handler run again. That is a second charge for a tool
whose side effect cannot be repeated and cannot take an idempotency key
downstream. Under ``park`` the ledger tells two cases apart:

* the holder died **before** its handler started: nothing happened, so the
  effect is taken over exactly as under ``take_over``;
* it died **after**: nobody knows whether the side effect happened, so the
  effect is parked (``requires_approval``, error code ``ambiguous_attempt``)
  and a person settles it.

To know which, a run under ``park`` records that its handler starts
(``Store.mark_started``, fenced by its attempt) just before calling it; a
takeover never takes an attempt recorded so, and ``Store.park`` takes only
those. The record costs one statement per run under ``park`` and nothing
under ``take_over``.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from agent_ledger.effects import Effect
from agent_ledger.engine.ownership import own
from agent_ledger.errors import EffectStoreError
from agent_ledger.observability import effect_fields, logger
from agent_ledger.stores.base import Store

__all__ = ["mark_started", "worker_name"]

_worker: tuple[int, str] | None = None


def worker_name() -> str:
    """Who runs handlers in this process, for the person settling a parked effect:
    ``host:pid`` (read again after a fork)."""
    global _worker
    pid = os.getpid()
    if _worker is None or _worker[0] != pid:
        _worker = (pid, f"{socket.gethostname()}:{pid}")
    return _worker[1]


async def mark_started(store: Store, effect: Effect, tx: object | None) -> Effect | None:
    """Record that ``effect``'s handler starts now and return it so recorded; None
    if the effect is no longer ours (taken over or canceled meanwhile): the
    handler must not run.

    Outside a caller's transaction, a cancellation while the record is in
    flight waits for it and gives the effect back (``ownership.own``): the
    handler never started, so the next caller runs it at once. A store error
    gives it back too, fenced by the attempt (the record may have landed
    before the reply was lost), and is raised: the handler never ran, so no
    one has to wonder whether it did.
    """
    worker = worker_name()
    if tx is not None:
        marked = await store.mark_started(effect.id, attempt=effect.attempt, worker=worker, tx=tx)
    else:
        marked = await _own_mark(store, effect, worker)
    return (
        dataclasses.replace(effect, park_attempt=effect.attempt, worker=worker) if marked else None
    )


async def _own_mark(store: Store, effect: Effect, worker: str) -> bool:
    step = store.mark_started(effect.id, attempt=effect.attempt, worker=worker)
    try:
        return await own(
            store,
            step,
            lambda marked: effect if marked else None,
            name="mark_started",
            held=effect,
        )
    except EffectStoreError:
        try:
            await store.release(effect.id, attempt=effect.attempt)
        except EffectStoreError:
            logger.exception(
                "could not give back an effect whose handler start could not be recorded; "
                "it stays processing until its lease runs out, then is taken over or parked",
                extra=effect_fields(effect),
            )
        raise
