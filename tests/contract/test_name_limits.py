"""Every name the ledger stores has one limit, 500 characters, on every store (issue 26, item 5).

A 4,000-character ``workflow_id`` was accepted by memory and SQLite and
failed on PostgreSQL with ``EffectStoreError`` (an index entry too large),
after the call had been made. Now every store refuses a longer name the same
way, with ``EffectLedgerValidationError`` naming the field, before anything
is stored; and a name at the limit, in 4-byte characters, is stored by every
store (PostgreSQL's index included).
"""

from __future__ import annotations

import pytest

from agent_ledger import EffectLedgerValidationError, EffectStatus, ToolCall
from agent_ledger.names import MAX_NAME_LENGTH
from agent_ledger.sagas._saga import owner_of
from tests.harness import StoreHarness

LONG = "w" * 4_000
AT_LIMIT = "\N{GRINNING FACE}" * MAX_NAME_LENGTH  # 4 bytes each in UTF-8


@pytest.mark.parametrize("field", ["workflow_id", "tool", "call_id"])
async def test_a_name_over_the_limit_is_refused_before_anything_is_stored(
    harness: StoreHarness, field: str
) -> None:
    names = {"workflow_id": "wf", "tool": "t", "call_id": "c1", field: LONG}
    with pytest.raises(EffectLedgerValidationError) as info:
        call = ToolCall(
            workflow_id=names["workflow_id"], tool=names["tool"], call_id=names["call_id"]
        )
        await harness.ledger().run(call, lambda e: "ran")
    assert info.value.field == field and str(MAX_NAME_LENGTH) in str(info.value)
    assert await harness.raw_count() == 0


async def test_names_at_the_limit_are_stored_by_every_store(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    call = ToolCall(workflow_id=AT_LIMIT, tool=AT_LIMIT[:100], call_id=AT_LIMIT)
    assert await ledger.run(call, lambda e: "ran") == "ran"
    stored = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert stored is not None and stored.workflow_id == AT_LIMIT


async def test_who_decided_is_a_name_too(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    call = ToolCall(workflow_id="wf", tool="t")
    with pytest.raises(EffectLedgerValidationError) as info:
        await ledger.deny(ledger.idem_key(call), by=LONG, reason="no")
    assert info.value.field == "by"

    def fail(effect: object) -> None:
        raise RuntimeError("down")

    with pytest.raises(RuntimeError):
        await ledger.run(call, fail)
    with pytest.raises(EffectLedgerValidationError) as info:
        await ledger.reopen(ledger.idem_key(call), by=LONG, reason="fixed")
    assert info.value.field == "by"
    stored = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert stored is not None and stored.status is EffectStatus.FAILED


def test_a_saga_owner_is_a_name_too() -> None:
    with pytest.raises(EffectLedgerValidationError) as info:
        owner_of(LONG)
    assert info.value.field == "owner"
