"""How long a holder's lease surely keeps others off its effect, and the waits
between tries of a store step that must land while it does.

Loop times throughout (``asyncio``'s clock): a lease is judged by when the
last heartbeat the store confirmed was sent. Apart from recording.py so each
engine module fits on a screen.
"""

from __future__ import annotations

import asyncio
import logging

from agent_ledger.backoff import COMMIT_RETRY
from agent_ledger.effects import Effect
from agent_ledger.engine.heartbeats import Beat
from agent_ledger.observability import log_effect
from agent_ledger.options import DEFAULT_STALE_AFTER_MS, ResolvedRunOptions

__all__ = ["lease_end", "lease_until", "pause", "stop_beat"]


async def pause(step: int, until: float, effect: Effect, what: str) -> bool:
    """After store error number ``step`` (from 0): wait before trying again, on the
    ``COMMIT_RETRY`` schedule, if the lease surely lasts until then (``until``,
    loop time); False, at once, when it does not (the caller gives up)."""
    remaining_s = until - asyncio.get_running_loop().time()
    if remaining_s <= 0:
        return False
    delay = COMMIT_RETRY.delay(step, remaining_s=remaining_s)
    log_effect(logging.WARNING, f"{what} failed; retrying in {delay:.2f} s", effect)
    await asyncio.sleep(delay)
    return True


def lease_end(alive_at: float, lease_ms: int) -> float:
    """The loop time until which a lease renewed at ``alive_at`` surely holds.

    ``alive_at`` is when the last heartbeat the store confirmed was sent (or
    the claim was made): the store's ``heartbeat_at`` is no earlier, so others
    may take over only ``lease_ms`` after it. A tenth of the lease, at most a
    second, is kept in hand for clocks and round trips.
    """
    lease_s = lease_ms / 1000.0
    return alive_at + lease_s - min(lease_s / 10.0, 1.0)


def lease_until(beat: Beat | None, opts: ResolvedRunOptions) -> float:
    """Until when (loop time) the lease surely keeps others off the effect."""
    if beat is None:
        # No takeover possible (after_ms=0), or inside a transaction (no
        # retries there): retry as long as a default lease would last.
        return lease_end(asyncio.get_running_loop().time(), DEFAULT_STALE_AFTER_MS)
    return lease_end(beat.confirmed_at, opts.stale_after_ms)


def stop_beat(beat: Beat | None, opts: ResolvedRunOptions) -> float:
    """Stop heartbeating; return until when the lease keeps others off the effect."""
    if beat is not None:
        beat.stop()
    return lease_until(beat, opts)
