"""Transactions for stores with one shared state (a dict, a single connection).

Such a store cannot isolate an open transaction from other steps, so it
serializes them: while a transaction is open, every other step of the same
store waits for it to end, as a database makes a second writer wait on the
rows a transaction holds. A step made *with* the handle goes straight in.

A transaction held that way also stops every other worker's heartbeats, so
time spent behind it must not count against anyone's lease: when a
transaction that held the store for at least :data:`LEASE_PAUSE_AFTER_MS`
ends (committed or not), each store moves the heartbeat of every effect that
was processing before it began forward by its duration, as if the lease clock
had stopped while nobody could heartbeat. Otherwise the first poll after a
long transaction would find a live worker "silent" and take it over, ahead of
the heartbeats queued behind the same transaction. A dead worker's takeover is
delayed by as much; PostgreSQL, which locks rows rather than the store, needs
none of this.

The gate also owns "who hears about a change, and when": a change made
outside a transaction wakes the key's waiters at once; one made inside a
transaction wakes them only after the transaction commits (a rolled-back
change never happened, so nobody is woken for it).

Work started inside a block is refused rather than left to wait: the block
cannot end while its own code waits for a step that waits for the block.
That is true of the task that opened it, and just as true of a task it
started and awaits there (``asyncio.gather``, ``asyncio.wait_for`` on 3.11,
a tool call run by ``call_sync``): ``transaction()`` records its handle in a
context variable, which every task started inside the block inherits, and a
step without ``tx=`` from such a context is refused. The store's own
background tasks (heartbeats, duplicate-count flushes, saga heartbeats) are
started with an empty context (``contextvars.Context()``): they must wait
for the transaction like any other worker, not be refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final, Generic, TypeVar

from agent_ledger.context import enter_transaction, leave_transaction, transactions_entered
from agent_ledger.errors import EffectInFlightError, EffectLedgerValidationError
from agent_ledger.stores._subscriptions import Subscribers
from agent_ledger.stores.base import waiting_before_work

__all__ = ["LEASE_PAUSE_AFTER_MS", "TransactionGate", "TransactionHandle"]

#: A transaction that held the store at least this long pauses the leases of
#: effects held elsewhere (see the module doc). Shorter ones delay a heartbeat
#: by less than the two spare beats every lease has, so they skip the work.
LEASE_PAUSE_AFTER_MS: Final = 50


class TransactionHandle:
    """What ``transaction()`` yields; pass it as ``tx``. Valid until the block ends."""

    def __init__(self, store: object) -> None:
        self._store = store
        #: Keys changed inside the transaction: their waiters are woken at commit.
        self._touched: set[str] = set()
        self.active = True

    def belongs_to(self, store: object) -> bool:
        """Whether this handle came from ``store``'s ``transaction()``."""
        return self._store is store

    def touch(self, idem_key: str) -> None:
        """Note that ``idem_key`` changed inside this transaction."""
        self._touched.add(idem_key)

    def touched(self) -> Iterable[str]:
        """The keys changed inside this transaction."""
        return self._touched


H = TypeVar("H", bound=TransactionHandle)


class TransactionGate(Generic[H]):
    """One store's open transaction, the lock that makes other steps wait for
    it, and the wake-ups its changes owe their waiters."""

    def __init__(
        self, store: object, handle_type: type[H], store_name: str, subscribers: Subscribers
    ) -> None:
        self._store = store
        self._handle_type = handle_type
        self._store_name = store_name
        self._subscribers = subscribers
        self.lock = asyncio.Lock()
        #: The open transaction, if any; stores read it for a lock-free fast path.
        self.active: H | None = None
        #: The task that opened it: the one task that must never wait for it.
        self._owner: asyncio.Task[object] | None = None

    async def enter(
        self, tx: object | None, *, lock_timeout_ms: int | None = None, idem_key: str = ""
    ) -> H | None:
        """Check ``tx``, or wait until no other task's transaction is open: at most
        ``lock_timeout_ms`` when given, then ``EffectInFlightError`` (``status=None``)
        about ``idem_key``, with nothing done (see "Lock waits" in ``stores.base``)."""
        if tx is not None:
            if not isinstance(tx, self._handle_type) or not tx.belongs_to(self._store):
                raise EffectLedgerValidationError(
                    f"tx must be a handle from this {self._store_name}'s transaction()", field="tx"
                )
            if not tx.active:
                raise EffectLedgerValidationError(
                    "tx is a transaction that has already ended", field="tx"
                )
            return tx
        if self.active is not None:
            self.refuse_inside()
            # Nothing done yet: a caller giving up may cancel this wait.
            with waiting_before_work():
                loop = asyncio.get_running_loop()
                until = None if lock_timeout_ms is None else loop.time() + lock_timeout_ms / 1000
                while self.active is not None:
                    # Not asyncio.timeout: it would cancel the caller's task, which
                    # the engine reads as the caller giving up (see ownership).
                    left = None if until is None else until - loop.time()
                    if left is not None and left <= 0:
                        raise EffectInFlightError(idem_key, None, lock_timeout_ms=lock_timeout_ms)
                    try:
                        await asyncio.wait_for(self.lock.acquire(), left)
                    except TimeoutError:
                        continue
                    self.lock.release()
        return None

    def refuse_inside(self) -> None:
        """Refuse a step that would wait for the open transaction from inside its
        block: from the task that holds it, or from a task started in the block
        (which inherited the block's context variable). The transaction cannot
        end while its block waits for that step, so the step would hang for
        ever. Cheap: call it only while one is open."""
        active = self.active
        if active is None:
            return
        if asyncio.current_task() is self._owner or active in transactions_entered():
            raise EffectLedgerValidationError(
                f"this call was made inside an open {self._store_name}.transaction() "
                "block (in its task, or in a task started there: asyncio.gather, "
                "asyncio.wait_for, a sync tool call), and it would wait for that "
                "transaction to end, which cannot happen while the block waits for "
                "the call: it would wait for ever. Make the call after the block; "
                "a call that takes tx= may instead be passed tx=<the handle the "
                "block yields>",
                field="tx",
            )

    def open(self, handle: H) -> None:
        """Mark ``handle`` as the open transaction (call with ``lock`` held), and
        the running context as inside its block."""
        self.active = handle
        self._owner = asyncio.current_task()
        enter_transaction(handle)

    def close(self, handle: H) -> None:
        """The transaction ended, committed or not: its handle is no longer valid."""
        handle.active = False
        self.active = None
        self._owner = None
        # A task started in the block keeps its copy of the mark: inert, as it
        # names a transaction that is no longer any store's open one.
        leave_transaction(handle)

    def changed(self, idem_key: str, tx: H | None) -> None:
        """``idem_key`` changed: wake its waiters now, or when ``tx`` commits."""
        if tx is None:
            self._subscribers.wake(idem_key)
        else:
            tx.touch(idem_key)

    def committed(self, handle: H) -> None:
        """``handle``'s transaction committed: wake the waiters of every key it changed.

        Call it after releasing ``lock``, so a woken waiter's poll need not wait.
        """
        for idem_key in handle.touched():
            self._subscribers.wake(idem_key)
