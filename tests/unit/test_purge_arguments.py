"""`purge` takes status names, and refuses unknown ones and dates further back than dates go."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    MemoryStore,
    ToolCall,
)
from agent_ledger.clock import ManualClock


async def test_purge_accepts_status_names_and_refuses_unknown_ones() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    await ledger.run(ToolCall(workflow_id="wf", tool="t", args={"n": 1}), lambda e: 1)
    clock.advance(ms=120_000)
    with pytest.raises(EffectLedgerValidationError, match="unknown status 'done'"):
        await ledger.purge(timedelta(minutes=1), statuses={"done"})
    with pytest.raises(EffectLedgerValidationError, match="statuses must be a set"):
        await ledger.purge(timedelta(minutes=1), statuses="succeeded")
    assert len(store) == 1
    assert await ledger.purge(timedelta(minutes=1), statuses={"failed"}) == 0
    assert await ledger.purge(timedelta(minutes=1), statuses={"succeeded"}) == 1
    assert len(store) == 0


async def test_purging_further_back_than_dates_go_is_a_clear_error() -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    with pytest.raises(EffectLedgerValidationError, match="older_than must be at most"):
        await ledger.purge(timedelta(days=999_999_999))
