"""Duplicate counts kept in memory and written in batches (the SQL stores).

Why: a replay must cost one read. Counting the duplicate in the same
statement (``dedup_count + 1``) made every replay a row-locking write that
waited for a durable commit, and calls on one hot key queued behind each
other's row lock. The count is a statistic: nothing in the ledger decides
anything by it. So a replay only notes "one more for this effect" here, and
:class:`PendingCounts` writes every effect's increments in one statement per
flush: every ``interval_s``, on ``flush()`` (the store's ``flush_counts()``)
and on the store's ``close()``.

Increments are kept by effect id, not by idempotency key: a key whose effect
was purged may be used again by a new effect, and a replay of the old one
must never be counted on the new one (a count may come out low, never high).
A flush matches rows by id, so the increments of an effect that is gone
match nothing and are dropped.

What a reader sees: the store adds this process's increments that are not
written yet to every effect it returns (``unwritten``), so a process reads
its own duplicates at once, as if they had been written. Another process
sees them once they are flushed. A read that ran while a flush was in
flight cannot tell whether its row already had that flush's increments
(the row and the flush commit on different connections), so the store reads
the count again after the flush (``ambiguous``): no read counts an
increment twice or misses one of this process's.

What may be lost: increments not yet written when the process dies (at most
one interval's, plus any held back while flushes were failing), and those of
a flush whose reply was lost (the connection died, or the flush task itself
was cancelled by the event loop shutting down, after the statement was
sent): writing them again might count them twice, and an undercount is the
documented failure mode, an overcount is not. A flush that failed for sure
(refused, timed out, no connection) keeps its increments for the next one.
A caller cancelled while waiting for a flush never cancels the flush itself:
it runs in a task of its own, so it is never cut in the middle.

Memory is bounded: at most ``max_keys`` distinct keys wait (a replay needs
the database, so they pile up only while it answers reads and refuses
writes); past that, increments of further keys are dropped, with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Final, TypeVar

from agent_ledger.errors import EffectLedgerValidationError, EffectStoreError
from agent_ledger.observability import logger
from agent_ledger.stores._columns import ROW_COLUMNS

__all__ = [
    "DEFAULT_FLUSH_INTERVAL_S",
    "MAX_PENDING_KEYS",
    "CountsLost",
    "PendingCounts",
    "check_flush_interval",
    "plus_one",
    "row_id",
    "with_count",
]

#: How often a store writes the duplicate counts it holds, by default (seconds).
DEFAULT_FLUSH_INTERVAL_S: Final = 1.0
#: At most this many distinct keys wait to be written; see the module doc.
MAX_PENDING_KEYS: Final = 100_000
#: How many recent flushes' keys are remembered to judge a read that overlapped them.
_REMEMBERED_FLUSHES: Final = 8

#: A store's transaction handle (or None), passed through to its count read.
_Tx = TypeVar("_Tx")

_ID: Final = ROW_COLUMNS.index("id")
_DEDUP: Final = ROW_COLUMNS.index("dedup_count")

#: Writes a batch {effect id: increment}; returns the ids it had to leave for
#: later (a row another transaction held locked).
Writer = Callable[[Mapping[str, int]], Awaitable[Collection[str]]]


def row_id(row: tuple[Any, ...]) -> str:
    """The effect id of a row (``ROW_COLUMNS`` first)."""
    return str(row[_ID])


def plus_one(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``row`` with one more duplicate counted (a replay's own, counted once it is answered)."""
    return (*row[:_DEDUP], row[_DEDUP] + 1, *row[_DEDUP + 1 :])


def with_count(row: tuple[Any, ...], dedup_count: int | None) -> tuple[Any, ...]:
    """``row`` with its stored ``dedup_count`` replaced (read again after a flush);
    as it was when ``dedup_count`` is None (the effect is gone meanwhile)."""
    if dedup_count is None:
        return row
    return (*row[:_DEDUP], dedup_count, *row[_DEDUP + 1 :])


class CountsLost(EffectStoreError):
    """A flush whose outcome is unknown (its reply was lost): its increments are dropped."""

    def __init__(self, message: str) -> None:
        super().__init__(message, operation="flush_counts")


def check_flush_interval(interval_s: object) -> float:
    """``interval_s`` as a float, or ``EffectLedgerValidationError`` naming the option."""
    if (
        isinstance(interval_s, bool)
        or not isinstance(interval_s, int | float)
        or not 0 < interval_s <= 3600
    ):
        raise EffectLedgerValidationError(
            "dedup_flush_interval_s must be a number of seconds above 0 and at most 3600, "
            f"got {interval_s!r}",
            field="dedup_flush_interval_s",
        )
    return float(interval_s)


class PendingCounts:
    """One store's duplicate counts not yet written, and the task that writes them."""

    def __init__(
        self, write: Writer, *, interval_s: float, store: str, max_keys: int = MAX_PENDING_KEYS
    ) -> None:
        self._write = write
        self.interval_s = interval_s
        self._store = store
        self._max_keys = max_keys
        #: Increments not yet sent, by effect id.
        self.pending: dict[str, int] = {}
        #: The batch being written now (empty when none is).
        self._inflight: Mapping[str, int] = {}
        #: Set by the store's writer, on the thread that wrote it, once the batch
        #: in flight is committed: for ``overlay_unshared`` (see there).
        self.inflight_committed = False
        #: +1 when a flush starts and +1 when it ends: odd while one is in flight.
        self.epoch = 0
        #: Recent flushes' batches, by the (even) epoch each started at.
        self._batches: dict[int, Collection[str]] = {}
        self._flushing: asyncio.Task[None] | None = None
        #: Reads re-counting under ``quiet()``; no flush starts while there are any.
        self._quiet = 0
        self._loud: asyncio.Event | None = None
        self._timer: asyncio.Task[None] | None = None
        self._dropping = False
        #: Set by ``close()``: no timer runs from then on (see ``add``).
        self.closed = False

    # -- counting --------------------------------------------------------------------

    def add(self, effect_id: str) -> None:
        """Count one duplicate of the effect ``effect_id``; the next flush writes it.

        After ``close()`` the count is kept but no timer starts: only an explicit
        ``flush()`` or another ``close()`` writes it. A closed store must not keep
        a task retrying against resources it has released.
        """
        pending = self.pending
        count = pending.get(effect_id, 0)
        if not count and len(pending) >= self._max_keys:
            if not self._dropping:
                self._dropping = True
                logger.warning(
                    "%s: %d keys' duplicate counts are waiting to be written; counts of "
                    "further keys are dropped until a flush succeeds",
                    self._store,
                    len(pending),
                )
            return
        pending[effect_id] = count + 1
        timer = self._timer
        if self.closed:
            return
        if timer is None or timer.done():
            # An empty context: a store transaction's block (see _transactions)
            # must not lend its mark to the timer, which waits for it instead.
            self._timer = asyncio.get_running_loop().create_task(
                self._tick(), context=contextvars.Context()
            )

    def unwritten(self, effect_id: str) -> int:
        """This process's increments of ``effect_id`` that no committed flush holds yet."""
        return self.pending.get(effect_id, 0) + self._inflight.get(effect_id, 0)

    def overlay(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """``row`` (``ROW_COLUMNS`` first) with this process's unwritten increments added."""
        extra = self.unwritten(row_id(row))
        if not extra:
            return row
        return (*row[:_DEDUP], row[_DEDUP] + extra, *row[_DEDUP + 1 :])

    def overlay_unshared(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """``overlay(row)`` for a read that no flush's write can overlap, so that it
        holds exactly the flushes committed before it: a read inside SQLite's own
        transaction, which every flush waits for (a flush already past that wait
        ran its statement first, on the store's one thread).

        Such a read must not wait for the flush in flight as ``quiet()`` does
        (the flush waits for the transaction the read belongs to: neither would
        ever end), and it need not: the in-flight batch is in ``row`` exactly when
        its writer said it committed.
        """
        effect_id = row_id(row)
        extra = self.pending.get(effect_id, 0)
        if not self.inflight_committed:
            extra += self._inflight.get(effect_id, 0)
        if not extra:
            return row
        return (*row[:_DEDUP], row[_DEDUP] + extra, *row[_DEDUP + 1 :])

    def snapshot(self) -> dict[str, int]:
        """The increments not yet written, by effect id; take it inside ``quiet()``
        (no flush in flight) and add those of effects read afterwards to an aggregate
        read of the stored counts: the two together count each duplicate once."""
        return dict(self.pending)

    def fallback(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """``overlay(row)`` for a read that overlapped a flush whose counts could not be
        read again: call it with no flush in flight (inside ``quiet()``). The flush's
        increments were either written (no longer unwritten here, maybe in ``row``),
        or put back (unwritten, and not in ``row``), so nothing is counted twice; the
        written ones may be missing from ``row``: a count low, never high."""
        return self.overlay(row)

    async def counted(
        self,
        rows: list[tuple[Any, ...]],
        started: int,
        read_counts: Callable[[list[str], _Tx], Awaitable[Mapping[str, int]]],
        tx: _Tx,
    ) -> list[tuple[Any, ...]]:
        """``rows``, read from epoch ``started`` on, with this process's unwritten
        duplicates added to their ``dedup_count``: what every store's read returns.

        A read that overlapped a flush of one of its effects may or may not hold
        it: the counts alone are read again (``read_counts(ids, tx)``, the
        store's own statement) once that flush has ended, with the next one held
        off meanwhile. If that read fails, the rows keep the counts they were
        read with: low, never high.
        """
        if not self.ambiguous(rows, started):
            return [self.overlay(row) for row in rows]
        async with self.quiet():
            try:
                stored = await read_counts([row_id(row) for row in rows], tx)
            except EffectStoreError:
                # The rows were read; only their counts are unsure (e.g. the store
                # was closed meanwhile).
                return [self.fallback(row) for row in rows]
            return [self.overlay(with_count(row, stored.get(row_id(row)))) for row in rows]

    def ambiguous(self, rows: Iterable[tuple[Any, ...]], started: int) -> bool:
        """Whether a read begun at epoch ``started`` may or may not hold a flush of one
        of its ``rows``: some flush of one of them was in flight while it ran."""
        now = self.epoch
        if now == started and not started & 1:
            return False
        keys = {row_id(row) for row in rows}
        for start in range(started - (started & 1), now, 2):
            batch = self._batches.get(start)
            if batch is None or not keys.isdisjoint(batch):
                return True
        return False

    async def settled(self) -> None:
        """Wait for the flush in flight, if any, to end (however it ends)."""
        flushing = self._flushing
        if flushing is not None:
            await asyncio.wait([flushing])

    @contextlib.asynccontextmanager
    async def quiet(self) -> AsyncIterator[None]:
        """Hold off flushes, once the one in flight has ended: a read inside cannot
        overlap a flush, so its counts plus ``overlay`` (taken inside too) are exact.

        For the rare read that overlapped a flush: without this, a store that
        flushes back to back could leave every read again ambiguous. Held for
        one round trip; a flush waits for it.
        """
        self._quiet += 1
        try:
            while self._flushing is not None:
                await self.settled()
            yield
        finally:
            self._quiet -= 1
            if not self._quiet and self._loud is not None:
                self._loud.set()

    # -- writing ---------------------------------------------------------------------

    async def flush(self) -> None:
        """Write every increment counted before this call; raise what a failed write raised
        (its increments stay pending, except those of a write whose reply was lost).

        Cancelling the caller only stops its waiting: the write goes on.
        """
        # One flush at a time (the epochs count them): wait out any in flight,
        # then start ours with no await in between.
        while self._flushing is not None or self._quiet:
            if self._flushing is not None:
                await self.settled()
            else:
                loud = self._loud = self._loud or asyncio.Event()
                loud.clear()
                await loud.wait()
        if not self.pending:
            return
        flushing = self._flushing = asyncio.get_running_loop().create_task(
            self._write_batch(), context=contextvars.Context()
        )
        await asyncio.shield(flushing)

    async def _write_batch(self) -> None:
        batch, self.pending = self.pending, {}
        start = self.epoch
        self._batches[start] = batch.keys()
        self._batches.pop(start - 2 * _REMEMBERED_FLUSHES, None)
        self._inflight = batch
        self.inflight_committed = False
        self.epoch = start + 1
        try:
            busy = await self._write(batch)
        except CountsLost as exc:
            logger.warning(
                "%s: a flush of %d duplicate counts lost its reply (%s); they are dropped "
                "rather than risk counting them twice",
                self._store,
                sum(batch.values()),
                exc.__cause__ or exc,
            )
            raise
        except asyncio.CancelledError:
            # Only the event loop shutting down cancels this task; the statement
            # may have run: the same as a lost reply.
            logger.warning(
                "%s: a flush of %d duplicate counts was cancelled; they are dropped",
                self._store,
                sum(batch.values()),
            )
            raise
        except BaseException:
            self._keep(batch, batch)
            raise
        else:
            self._keep(batch, busy)
            self._dropping = False
        finally:
            self._inflight = {}
            self.inflight_committed = False
            self.epoch = start + 2
            self._flushing = None

    def _keep(self, batch: Mapping[str, int], keys: Iterable[str]) -> None:
        """Put ``keys``' increments of ``batch`` back, ahead of the next flush."""
        pending = self.pending
        for key in keys:
            pending[key] = pending.get(key, 0) + batch[key]

    async def _tick(self) -> None:
        """Flush every interval while anything waits; end when nothing does."""
        while (self.pending or self._flushing is not None) and not self.closed:
            await asyncio.sleep(self.interval_s)
            if self.closed:
                return
            try:
                await self.flush()
            except Exception as exc:
                logger.warning(
                    "%s: writing duplicate counts failed (%s); %d keys' counts are kept for "
                    "the next try",
                    self._store,
                    exc,
                    len(self.pending),
                )

    async def close(self) -> None:
        """Stop the timer and write what is pending; a failure is logged, not raised
        (``close()`` must release the store's resources however the database is doing).

        From here on no timer runs (see ``add``)."""
        self.closed = True
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        try:
            await self.flush()
        except Exception as exc:
            logger.warning(
                "%s closed without writing %d duplicate counts (%s)",
                self._store,
                sum(self.pending.values()),
                exc,
            )
