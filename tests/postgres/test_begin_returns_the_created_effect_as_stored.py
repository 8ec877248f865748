"""begin's created effect is the row as stored.

The effect a caller runs its handler with is the one begin returns; its
receipt is what the table holds. A begin that built any part of it from what
it sent rather than what was stored (a default, a value the column changes,
a shortcut that skips reading the row back) would let the two differ: each
case here compares them, field by field, plain and partitioned, with and
without the caller's transaction.
"""

from __future__ import annotations

import uuid

import pytest

from agent_ledger.effects import scoped_history
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import NewEffect
from tests.harness import open_harness


def _new(**fields: object) -> NewEffect:
    values: dict[str, object] = {
        "idem_key": uuid.uuid4().hex * 2,
        "workflow_id": "wf-é",
        "call_id": None,
        "tool": "charge",
        "args_canonical": '{"amount":12.5,"to":"a@b.c"}',
        "resource_id_canonical": None,
    }
    values.update(fields)
    return NewEffect(**values)  # type: ignore[arg-type]


CASES = [
    pytest.param({}, id="plain"),
    pytest.param({"requires_approval": True}, id="requires-approval"),
    pytest.param(
        {"call_id": "call_1", "resource_id_canonical": '"acct-9"'}, id="call-and-resource"
    ),
    pytest.param({"lease_ms": 0}, id="no-lease"),
    pytest.param({"lease_ms": 123_456}, id="long-lease"),
    pytest.param({"history": scoped_history("turn", "turn-7", "call_1")}, id="scoped"),
]


@pytest.mark.parametrize("table", ["plain", pytest.param("partitioned", marks=pytest.mark.slow)])
@pytest.mark.parametrize("fields", CASES)
async def test_a_created_effect_equals_its_stored_row(
    table: str, fields: dict[str, object]
) -> None:
    async with open_harness("postgres" if table == "plain" else "postgres-partitioned") as harness:
        store = harness.store
        new = _new(**fields)
        begun = await store.begin(new, lock_timeout_ms=1_000)
        assert begun.created
        stored = await store.find(new.idem_key)
        assert stored is not None
        assert begun.effect == stored
        expected = (
            EffectStatus.REQUIRES_APPROVAL if new.requires_approval else EffectStatus.PROCESSING
        )
        assert begun.effect.status is expected
        assert begun.effect.idem_key == new.idem_key and begun.effect.lease_ms == new.lease_ms


@pytest.mark.parametrize("fields", CASES)
async def test_a_created_effect_equals_its_stored_row_in_a_transaction(
    fields: dict[str, object],
) -> None:
    async with open_harness("postgres") as harness:
        store = harness.store
        new = _new(**fields)
        async with store.transaction() as tx:
            begun = await store.begin(new, tx=tx)
            assert begun.created
            stored = await store.find(new.idem_key, tx=tx)
        assert stored is not None
        assert begun.effect == stored
