"""In-process fan-out of change notifications, shared by the stores that notify.

A store calls :meth:`Subscribers.wake` when it learns that an effect changed
(directly for MemoryStore, from ``LISTEN`` for PostgresStore); each waiter
holds a :class:`Subscription` that remembers a wake-up until it is consumed,
so a change between the waiter's poll and its wait is never missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class Subscription:
    """One waiter's view of one key's changes (implements ``stores.base.Subscription``)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> bool:
        if not self._event.is_set():
            try:
                async with asyncio.timeout(max(timeout_s, 0.0)):
                    await self._event.wait()
            except TimeoutError:
                return False
        self._event.clear()
        return True


class Subscribers:
    """The subscriptions of one store, by idempotency key."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[Subscription]] = {}

    @contextmanager
    def subscription(self, idem_key: str) -> Iterator[Subscription]:
        subscription = Subscription()
        self._by_key.setdefault(idem_key, set()).add(subscription)
        try:
            yield subscription
        finally:
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
