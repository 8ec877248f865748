"""Transactions for stores with one shared state (a dict, a single connection).

Such a store cannot isolate an open transaction from other steps, so it
serializes them: while a transaction is open, every other step of the same
store waits for it to end, as a database makes a second writer wait on the
rows a transaction holds. A step made *with* the handle goes straight in.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from agent_ledger.errors import EffectLedgerValidationError

__all__ = ["TransactionGate", "TransactionHandle"]


class TransactionHandle:
    """What ``transaction()`` yields; pass it as ``tx``. Valid until the block ends."""

    def __init__(self, store: object) -> None:
        self._store = store
        #: Keys changed inside the transaction: their waiters are woken at commit.
        self._touched: set[str] = set()
        self.active = True


H = TypeVar("H", bound=TransactionHandle)


class TransactionGate(Generic[H]):
    """One store's open transaction, and the lock that makes other steps wait for it."""

    def __init__(self, store: object, handle_type: type[H], store_name: str) -> None:
        self._store = store
        self._handle_type = handle_type
        self._store_name = store_name
        self.lock = asyncio.Lock()
        #: The open transaction, if any; stores read it for a lock-free fast path.
        self.active: H | None = None

    async def enter(self, tx: object | None) -> H | None:
        """Check ``tx``, or wait until no other task's transaction is open."""
        if tx is not None:
            if not isinstance(tx, self._handle_type) or tx._store is not self._store:
                raise EffectLedgerValidationError(
                    f"tx must be a handle from this {self._store_name}'s transaction()", field="tx"
                )
            if not tx.active:
                raise EffectLedgerValidationError(
                    "tx is a transaction that has already ended", field="tx"
                )
            return tx
        while self.active is not None:
            async with self.lock:
                pass
        return None

    def open(self, handle: H) -> None:
        """Mark ``handle`` as the open transaction (call with ``lock`` held)."""
        self.active = handle

    def close(self, handle: H) -> None:
        handle.active = False
        self.active = None
