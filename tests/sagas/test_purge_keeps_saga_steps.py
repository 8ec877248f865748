"""purge() on every store keeps the effects a saga records (issue 30).

Sagas are never purged; deleting their steps' effects left a saga whose
`sagas show` listed every step as never run ("forward -").
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_ledger.sagas import SagaFailed
from agent_ledger.sagas._outcome import read_outcome
from agent_ledger.sagas._saga import saga_store
from tests.harness import StoreHarness
from tests.sagas.conftest import shop_of


async def test_purge_keeps_a_sagas_steps_and_undos_and_deletes_the_rest(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "pay", "ship")
    shop.failing.add("ship")
    with pytest.raises(SagaFailed):
        await ledger.run_saga("order", [{"tool": "pay", "args": {"item": "o1"}},
                                        {"tool": "ship", "args": {"item": "o1"}}])  # fmt: skip
    async with ledger.workflow("alone"):
        await shop["pay"]("o2")
    saga_keys = 3  # pay, ship (failed) and the undo of pay
    assert await harness.raw_count() == saga_keys + 1
    await harness.age(2 * 86_400_000)

    assert await ledger.purge(older_than=timedelta(days=1)) == 1, "only the lone effect"
    assert await harness.raw_count() == saga_keys
    store = saga_store(ledger)
    saga = await store.get_saga("order")
    assert saga is not None
    outcome = await read_outcome(ledger, store, saga)
    for step in outcome.steps:
        assert step.forward is not None, f"step {step.step.tool} lost its effect"
    assert outcome.steps[0].compensation is not None, "the undo of pay lost its effect"
