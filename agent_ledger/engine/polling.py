"""Single-flight polls: waiters in one process share one read of the same key.

When an effect finishes, every caller waiting on it wakes at once. Without
sharing, 50 waiters send 50 identical queries and the last one returns only
after the other 49; with it, one query answers them all.

A shared answer never hands out ownership: only the caller that sent a
claim can win it. The others learn the effect's state and carry on (a
claimed effect is ``processing`` to them, so they wait). If the sender is
cancelled or its query fails, the others simply poll for themselves.
"""

from __future__ import annotations

import asyncio

from agent_ledger.decisions import ambiguous_error
from agent_ledger.effects import Effect
from agent_ledger.engine.ownership import own
from agent_ledger.stores.base import ClaimOutcome, Store

__all__ = ["SharedPolls"]


class SharedPolls:
    """The polls in flight for one ledger, by idempotency key."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._in_flight: dict[str, asyncio.Future[tuple[Effect | None, bool]]] = {}

    async def poll(
        self,
        idem_key: str,
        *,
        claim_stale_after_ms: int | None,
        tx: object | None,
        park: bool = False,
        lock_timeout_ms: int | None = None,
    ) -> tuple[Effect | None, bool, bool]:
        """Read the effect, claiming it when ``claim_stale_after_ms`` is given (or,
        with ``park``, parking it: ``Store.park`` with that window instead). A
        claim outside a transaction waits at most ``lock_timeout_ms`` for another
        transaction's lock on the row (``EffectInFlightError`` past it).

        Returns ``(effect, won, shared)``: ``won`` (claimed, or parked) only
        for the caller whose own query made the change, ``shared`` when the
        answer came from another caller's query.
        """
        running = self._in_flight.get(idem_key)
        if running is not None and tx is None and running.get_loop() is asyncio.get_running_loop():
            try:
                effect, _claimed_by_sender = await asyncio.shield(running)
            except Exception:
                pass  # the sender's poll failed or was abandoned: poll ourselves
            else:
                return effect, False, True
        return await self._own_poll(idem_key, claim_stale_after_ms, tx, park, lock_timeout_ms)

    async def _own_poll(
        self,
        idem_key: str,
        claim_stale_after_ms: int | None,
        tx: object | None,
        park: bool,
        lock_timeout_ms: int | None,
    ) -> tuple[Effect | None, bool, bool]:
        # Inside a transaction the caller may see its own uncommitted writes:
        # such a read is not for sharing.
        future: asyncio.Future[tuple[Effect | None, bool]] | None = None
        if tx is None and idem_key not in self._in_flight:
            future = asyncio.get_running_loop().create_future()
            self._in_flight[idem_key] = future
        try:
            if claim_stale_after_ms is not None and park and tx is None:
                # Parking makes nobody the owner: nothing to give back. A
                # cancelled park is still carried to its end, so the waiter
                # can then read whether it landed (and page someone).
                parking = self._store.park(
                    idem_key, stale_after_ms=claim_stale_after_ms, error=ambiguous_error()
                )
                last = await own(self._store, parking, _gives_nothing_back, name="park")
                result = (last.effect, last.claimed)
            elif claim_stale_after_ms is not None:
                claim = self._store.claim(
                    idem_key,
                    stale_after_ms=claim_stale_after_ms,
                    tx=tx,
                    lock_timeout_ms=lock_timeout_ms if tx is None else None,
                )
                # Outside a transaction, a cancelled claim is waited for, and an
                # effect it took is given back (see ownership).
                outcome = await (
                    claim if tx is not None else own(self._store, claim, _claimed, name="claim")
                )
                result = (outcome.effect, outcome.claimed)
            else:
                result = (await self._store.find(idem_key, tx=tx), False)
        except BaseException as exc:
            if future is not None:
                # Joiners must not inherit our cancellation: give them an
                # ordinary exception, which sends them to poll themselves.
                future.set_exception(_Abandoned(repr(exc)))
                future.exception()  # mark retrieved: nobody may be waiting
            raise
        finally:
            if future is not None:
                del self._in_flight[idem_key]
        if future is not None:
            future.set_result(result)
        return result[0], result[1], False


def _claimed(outcome: ClaimOutcome) -> Effect | None:
    return outcome.effect if outcome.claimed else None


def _gives_nothing_back(_: ClaimOutcome) -> None:
    return None


class _Abandoned(Exception):
    """The shared poll ended without an answer."""
