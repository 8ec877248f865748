"""Clocks for stores that keep time themselves (Memory); SQL stores use the database's."""

from __future__ import annotations

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

    def __call__(self) -> datetime:
        return self._now

    def advance(self, *, ms: float) -> None:
        """Move the clock forward by ``ms`` milliseconds."""
        self._now += timedelta(milliseconds=ms)
