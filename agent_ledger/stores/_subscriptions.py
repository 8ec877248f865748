"""In-process fan-out of change notifications, shared by the stores that notify.

A store calls :meth:`Subscribers.wake` when it learns that an effect changed
(directly for MemoryStore and SqliteStore, from ``LISTEN`` for
PostgresStore); each waiter holds a :class:`Subscription` that remembers a
wake-up until it is consumed, so a change between the waiter's poll and its
wait is never missed. Everything here is on the wait path of every
duplicate caller, so it avoids generator-based context managers and
``asyncio.timeout``: a future and one timer handle per wait are enough.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Subscription:
    """One waiter's view of one key's changes (implements ``stores.base.Subscription``)."""

    __slots__ = ("_changed", "_waiter")

    def __init__(self) -> None:
        self._changed = False
        self._waiter: asyncio.Future[bool] | None = None

    def notify(self) -> None:
        self._changed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    async def wait(self, timeout_s: float) -> bool:
        if not self._changed:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(max(timeout_s, 0.0), _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        changed, self._changed = self._changed, False
        return changed


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Registration:
    """``async with subscribers.subscribe(key) as subscription:``, registered meanwhile."""

    __slots__ = ("_key", "_owner", "subscription")

    def __init__(self, owner: Subscribers, idem_key: str) -> None:
        self._owner = owner
        self._key = idem_key
        self.subscription = Subscription()

    async def __aenter__(self) -> Subscription:
        self._owner.add(self._key, self.subscription)
        return self.subscription

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._owner.discard(self._key, self.subscription)


class Subscribers:
    """The subscriptions of one store, by idempotency key."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[Subscription]] = {}

    def subscribe(self, idem_key: str) -> Registration:
        return Registration(self, idem_key)

    def add(self, idem_key: str, subscription: Subscription) -> None:
        """Register ``subscription`` for ``idem_key`` (``Registration`` does this on entry)."""
        self._by_key.setdefault(idem_key, set()).add(subscription)

    def discard(self, idem_key: str, subscription: Subscription) -> None:
        """Unregister ``subscription``; forget the key once nobody listens to it."""
        subscribers = self._by_key[idem_key]
        subscribers.discard(subscription)
        if not subscribers:
            del self._by_key[idem_key]

    def wake(self, idem_key: str) -> None:
        for subscription in self._by_key.get(idem_key, ()):
            subscription.notify()

    def wake_all(self) -> None:
        for subscribers in self._by_key.values():
            for subscription in subscribers:
                subscription.notify()
