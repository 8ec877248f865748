"""Effects that wait for a person, made the way the library makes them.

Tests that need a pending effect (to approve, deny or list it) create it like
an approval-gated ``run()`` does: ``begin`` inserts it straight into
``requires_approval``. ``approval_timeout_ms=0`` makes that caller stop
waiting at once, so the effect is left pending and no task lingers.
"""

from __future__ import annotations

import pytest

from agent_ledger import (
    ConcurrencyOptions,
    Effect,
    EffectLedger,
    EffectStatus,
    EffectTimeoutError,
    LedgerHooks,
    RunOptions,
    ToolCall,
)

__all__ = ["PENDING", "make_pending"]

#: Needs approval, and does not stay to wait for it.
PENDING = RunOptions(requires_approval=True, concurrency=ConcurrencyOptions(approval_timeout_ms=0))


async def make_pending(
    ledger: EffectLedger, call: ToolCall, *, hooks: LedgerHooks | None = None
) -> Effect:
    """Create ``call``'s effect waiting for approval and return it as stored."""
    with pytest.raises(EffectTimeoutError):
        await ledger.begin(call, run_options=PENDING, hooks=hooks)
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    return effect
