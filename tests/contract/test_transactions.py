"""tx: the effect record commits or rolls back with the caller's transaction."""

from __future__ import annotations

import pytest

from agent_ledger import CommitSucceeded, EffectLedgerValidationError, EffectStatus, ToolCall
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="ledger.post", args={"amount": 5})


class Abort(Exception):
    pass


async def test_run_in_a_committed_transaction_is_recorded(harness: StoreHarness) -> None:
    """An effect written inside a transaction is there once the block exits."""
    ledger = harness.ledger()
    async with harness.store.transaction() as tx:
        assert await ledger.run(CALL, lambda e: "posted", tx=tx) == "posted"
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.SUCCEEDED


async def test_run_in_a_rolled_back_transaction_leaves_no_trace(harness: StoreHarness) -> None:
    """If the caller's transaction rolls back, so does the effect: a retry runs again."""
    ledger = harness.ledger()
    with pytest.raises(Abort):
        async with harness.store.transaction() as tx:
            await ledger.run(CALL, lambda e: "posted", tx=tx)
            raise Abort
    assert await ledger.find_by_idem_key(ledger.idem_key(CALL)) is None
    assert await harness.raw_count() == 0
    assert await ledger.run(CALL, lambda e: "posted again") == "posted again"


async def test_begin_and_commit_in_one_transaction(harness: StoreHarness) -> None:
    """begin() and commit() accept the same tx; a rollback undoes both."""
    ledger = harness.ledger()
    with pytest.raises(Abort):
        async with harness.store.transaction() as tx:
            begun = await ledger.begin(CALL, tx=tx)
            assert await ledger.commit(begun.effect.id, CommitSucceeded(result=1), tx=tx)
            raise Abort
    assert await harness.raw_count() == 0
    async with harness.store.transaction() as tx:
        begun = await ledger.begin(CALL, tx=tx)
        assert await ledger.commit(begun.effect.id, CommitSucceeded(result=2), tx=tx)
    assert await ledger.run(CALL, lambda e: 3) == 2


async def test_rollback_restores_an_existing_effect(harness: StoreHarness) -> None:
    """Rolling back a replay undoes its dedup increment, not the earlier receipt."""
    ledger = harness.ledger()
    await ledger.run(CALL, lambda e: "first")
    with pytest.raises(Abort):
        async with harness.store.transaction() as tx:
            assert await ledger.run(CALL, lambda e: "x", tx=tx) == "first"
            raise Abort
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.result, effect.dedup_count) == ("first", 0)


async def test_foreign_transaction_handles_are_rejected(harness: StoreHarness) -> None:
    """A tx that is not this store's gets a clear error and stores nothing."""
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError, match="tx"):
        await ledger.run(CALL, lambda e: 1, tx=object())
    assert await harness.raw_count() == 0
