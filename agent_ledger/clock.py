"""Clocks for stores that keep time themselves (Memory); SQL stores use the database's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

#: A callable returning the current time as an aware UTC datetime.
Clock: TypeAlias = Callable[[], datetime]


def utc_now() -> datetime:
    """The system clock, in UTC."""
    return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to, for tests of staleness.

    >>> clock = ManualClock()
    >>> before = clock()
    >>> clock.advance(ms=60_000)
    >>> (clock() - before).total_seconds()
    60.0
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start if start is not None else utc_now()
        if self._now.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime (e.g. datetime.now(UTC))")
        #: Every delay ``sleep`` was asked for, in seconds, in order.
        self.slept: list[float] = []

    def __call__(self) -> datetime:
        return self._now

    def advance(self, *, ms: float) -> None:
        """Move the clock forward by ``ms`` milliseconds."""
        self._now += timedelta(milliseconds=ms)

    async def sleep(self, seconds: float) -> None:
        """A sleep that takes no time: note ``seconds`` in ``slept`` and move the clock on.

        Give it to ``EffectLedgerOptions(sleep=...)`` (with the clock itself
        as ``clock=``) so tests of retries never wait. It still yields to the
        event loop once, as a real sleep would, so other tasks get to run.
        """
        self.slept.append(seconds)
        self.advance(ms=seconds * 1000.0)
        await asyncio.sleep(0)
