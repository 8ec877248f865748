"""Effects that wait for a person, made the way the library makes them.

Tests that need a pending effect (to approve, deny or list it) create it like
an approval-gated ``run()`` does: ``begin`` inserts it straight into
``requires_approval``. ``approval_timeout_ms=0`` makes that caller stop
waiting at once, so the effect is left pending and no task lingers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from agent_ledger import Effect, EffectLedger, EffectStatus, LedgerHooks, RunOptions, ToolCall
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions, StaleOptions

__all__ = ["PARK", "PENDING", "make_parked", "make_pending"]

#: Needs approval, and does not stay to wait for it.
PENDING = RunOptions(requires_approval=True, concurrency=ConcurrencyOptions(approval_timeout_ms=0))
#: A run whose silent holder is parked for a person, with a 1 s lease.
PARK = RunOptions(on_stale="park", stale=StaleOptions(after_ms=1_000))


async def make_pending(
    ledger: EffectLedger, call: ToolCall, *, hooks: LedgerHooks | None = None
) -> Effect:
    """Create ``call``'s effect waiting for approval and return it as stored."""
    with pytest.raises(EffectTimeoutError):
        await ledger.begin(call, run_options=PENDING, hooks=hooks)
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    return effect


async def make_parked(
    ledger: EffectLedger, call: ToolCall, age: Callable[[float], Awaitable[None]]
) -> Effect:
    """Create ``call``'s effect parked as an ambiguous attempt, as a dead worker leaves it.

    A worker ``begin()``s it under ``on_stale="park"`` (which records the
    handler's start) and never commits; ``age`` moves the store's clock past
    its lease; the sweep parks it.
    """
    begun = await ledger.begin(call, run_options=PARK)
    assert begun.effect.status is EffectStatus.PROCESSING
    await age(60_000)
    parked = [e for e in await ledger.park_stale() if e.idem_key == begun.effect.idem_key]
    assert len(parked) == 1 and parked[0].parked, parked
    return parked[0]
