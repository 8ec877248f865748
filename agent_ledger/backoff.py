"""Every delay agent-ledger waits is computed here.

Waiters polling another caller's effect, the ledger retrying a commit after
a store error, and the Postgres listener reconnecting all wait in the same
shape: a first delay, growing by a factor after each try, capped, and
optionally spread by jitter so that many callers do not retry in step. One
:class:`Backoff` describes such a schedule; ``delay(n)`` is the pause before
try ``n + 1``. Later layers (tool retries, sagas) reuse it rather than grow
their own arithmetic.

The growth itself is deterministic (the jitter is applied to each delay, not
carried into the next one), so a schedule is easy to reason about: with
``initial_s=0.05, multiplier=1.5, max_s=1.0`` the un-jittered delays are
0.05, 0.075, 0.1125, ... up to 1.0 and then 1.0 for ever.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "COMMIT_RETRY",
    "LISTENER_RECONNECT",
    "LOCK_WAIT_SLICE_MS",
    "MAX_MS",
    "Backoff",
    "too_many_ms",
]

#: The longest time, in milliseconds, an option accepts: 365000 days (about
#: 1000 years; ``audit.MAX_SPAN`` is the same span). Each clock the ledger
#: turns an option into holds it exactly: seconds as a float for asyncio,
#: a ``timedelta``, 64-bit microseconds in the stores. A longer one would
#: overflow one of them (``10**400`` is past any float) in the middle of a
#: run, after the effect was stored, so options refuse it when built.
MAX_MS: Final = 365_000 * 86_400_000


def too_many_ms(value: int, name: str, maximum: int = MAX_MS) -> str | None:
    """Why ``value`` (ms) is past ``maximum``, naming the field and the bound; None if not.

    A huge int is described by its size, never printed: ``str()`` of an int
    with over 4300 digits raises.
    """
    if value <= maximum:
        return None
    shown = str(value) if value.bit_length() < 200 else f"an int of {value.bit_length()} bits"
    return f"{name} must be at most {maximum} milliseconds, got {shown}"


@dataclass(frozen=True, slots=True)
class Backoff:
    """A capped exponential schedule of delays, in seconds, with optional jitter.

    ``tries`` bounds how many delays the schedule has (``None``: unbounded);
    :meth:`delay` raises ``IndexError`` past it, and :meth:`gives_up_after`
    tells a retry loop when to stop.
    """

    initial_s: float
    multiplier: float = 2.0
    max_s: float = float("inf")
    #: Each delay is scaled by a random factor in ``[1 - jitter, 1 + jitter]``.
    jitter: float = 0.0
    tries: int | None = None

    def __post_init__(self) -> None:
        if not self.initial_s > 0 or not self.max_s >= self.initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {self.initial_s}, {self.max_s}")
        if not self.multiplier >= 1.0:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")
        if self.tries is not None and self.tries < 0:
            raise ValueError(f"tries must be >= 0 or None, got {self.tries}")

    def base(self, step: int) -> float:
        """The un-jittered delay before try ``step + 1`` (``step`` counts from 0)."""
        if self.tries is not None and step >= self.tries:
            raise IndexError(f"this schedule has {self.tries} delays; asked for number {step}")
        if step <= 0:
            return self.initial_s
        # Capped before it can overflow: past the cap, every delay is the cap.
        delay = self.initial_s
        for _ in range(step):
            delay *= self.multiplier
            if delay >= self.max_s:
                return self.max_s
        return delay

    def delay(
        self,
        step: int,
        *,
        remaining_s: float | None = None,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> float:
        """The pause before try ``step + 1``: jittered, and never past ``remaining_s``.

        ``remaining_s`` is the time left in the caller's budget: a waiter
        whose deadline is near sleeps only until the deadline.
        """
        delay = self.base(step)
        if self.jitter:
            delay *= 1.0 + self.jitter * uniform(-1.0, 1.0)
        if remaining_s is not None:
            delay = min(delay, max(remaining_s, 0.0))
        return delay

    def gives_up_after(self, step: int) -> bool:
        """True when try ``step + 1`` has no delay left to precede it."""
        return self.tries is not None and step >= self.tries


#: Recording a handler's outcome after a store error: the side effect has
#: happened, so the ledger keeps retrying, at most a second apart, for as long
#: as its lease keeps everyone else off the effect (see ``engine.Engine.record``):
#: the schedule has no count of its own, the lease bounds it.
COMMIT_RETRY: Final = Backoff(initial_s=0.05, multiplier=2.0, max_s=1.0)

#: The Postgres notification listener, after losing its connection.
LISTENER_RECONNECT: Final = Backoff(initial_s=0.05, multiplier=2.0, max_s=5.0)

#: The longest one store step outside any transaction (a begin, a waiter's
#: claim) waits for a lock another transaction holds on its key (PostgreSQL,
#: MySQL: an uncommitted insert or claim of it; SQLite: the write lock, or
#: the store's open ``transaction()``) before the caller looks at its own
#: ``wait_timeout_ms`` again and tries anew. A step waiting inside the
#: database cannot be abandoned without losing its reply (it may have landed),
#: so the caller waits for it: a slice this short is what lets a cancellation
#: land, and the wait end, at most this much late. Every try gets a whole
#: slice, however little of the wait is left (even ``wait_timeout_ms=0``): on
#: SQLite the lock is the file's write lock, which any writer holds for a
#: moment, and a caller must not fail for an unrelated heartbeat or commit.
LOCK_WAIT_SLICE_MS: Final = 100
