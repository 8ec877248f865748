"""Saga settings a store cannot keep are refused before anything is stored, and the
longest allowed saga id and lease are stored intact. Every store through the harness."""

from __future__ import annotations

from typing import Any

import pytest

from agent_ledger import EffectLedgerValidationError
from agent_ledger.options import MAX_LEASE_MS
from agent_ledger.sagas import (
    SagaStatus,
)
from agent_ledger.sagas._saga import MAX_SAGA_ID_LENGTH, saga_store
from tests.harness import StoreHarness
from tests.sagas.conftest import shop_of

G = SagaStatus


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"lease_ms": MAX_LEASE_MS + 1}, "lease_ms"),
        ({"lease_ms": 2**63}, "lease_ms"),
        ({"owner": 5}, "owner"),
        ({"owner": b"host"}, "owner"),
        ({"owner": " "}, "owner"),
        ({"saga_id": "x" * (MAX_SAGA_ID_LENGTH + 1)}, "saga_id"),
    ],
    ids=["lease 2**31", "lease 2**63", "owner int", "owner bytes", "owner blank", "long id"],
)
async def test_settings_a_store_cannot_keep_are_refused_and_nothing_is_stored(
    harness: StoreHarness, settings: dict[str, Any], field: str
) -> None:
    ledger = harness.ledger()
    settings = dict(settings)
    saga_id = settings.pop("saga_id", "settings-1")
    with pytest.raises(EffectLedgerValidationError) as refused:
        async with ledger.saga(saga_id, **settings):
            pytest.fail("never entered")
    assert refused.value.field == field
    assert await saga_store(ledger).get_saga(saga_id) is None
    if field in ("lease_ms", "owner"):
        with pytest.raises(EffectLedgerValidationError) as again:
            await ledger.recover_sagas(**settings)
        assert again.value.field == field


async def test_the_longest_saga_id_and_lease_are_stored(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge")
    # Four bytes a character in UTF-8, none compressible: the worst case for an index.
    saga_id = "".join(chr(0x1F600 + (i * 7919) % 80) for i in range(MAX_SAGA_ID_LENGTH))
    async with ledger.saga(saga_id, lease_ms=MAX_LEASE_MS, owner="o" * 300):
        await shop["charge"]("o")
    saga = await saga_store(ledger).get_saga(saga_id)
    assert saga is not None and saga.status is G.COMPLETED and saga.lease_ms == MAX_LEASE_MS
