"""Sagas through a FaultyStore: a saga step's outage or lost reply, on every store."""

from __future__ import annotations

import pytest

from agent_ledger import EffectStoreError
from agent_ledger.sagas import SagaFailed, SagaStatus
from agent_ledger.sagas._saga import saga_store
from agent_ledger.testing import SAGA_STEPS, FaultyStore, build_ledger
from tests.harness import StoreHarness
from tests.sagas.conftest import shop_of


async def test_every_saga_step_goes_through_and_can_fail(harness: StoreHarness) -> None:
    store = FaultyStore(harness.store)
    ledger = build_ledger(store)
    shop = shop_of(ledger, "s1", "s2")
    async with ledger.saga("through"):
        await shop["s1"]("a")
        await shop["s2"]("b")
    assert shop.log == ["s1", "s2"]
    assert {"begin_saga", "record_step", "finish_saga"} <= set(store.calls)
    assert set(store.calls) <= set(SAGA_STEPS) | {"begin", "commit", "check_schema", "find"}
    saga = await saga_store(ledger).get_saga("through")
    assert saga is not None and saga.status is SagaStatus.COMPLETED
    with pytest.raises(ValueError, match="unknown store steps"):
        store.fail("record_steps")


async def test_a_step_whose_record_fails_never_runs_and_the_saga_rolls_back(
    harness: StoreHarness,
) -> None:
    """The step row comes before the forward effect: no row, no run."""
    store = FaultyStore(harness.store)
    ledger = build_ledger(store)
    shop = shop_of(ledger, "s1", "s2")
    store.fail("record_step")  # the first step's record
    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("outage"):
            await shop["s1"]("a")
            await shop["s2"]("b")
    assert isinstance(failed.value.__cause__, EffectStoreError)
    assert failed.value.status is SagaStatus.COMPENSATED
    assert shop.log == []
    assert await saga_store(ledger).saga_steps("outage") == []


async def test_a_lost_reply_of_the_final_move_is_finished_by_a_re_run(
    harness: StoreHarness,
) -> None:
    """The completing move landed but its reply was lost: the caller sees the
    error; running the saga's code again finds it complete and runs nothing."""
    store = FaultyStore(harness.store)
    ledger = build_ledger(store)
    shop = shop_of(ledger, "s1", "s2")

    async def order() -> list[object]:
        async with ledger.saga("lost-reply"):
            return [await shop["s1"]("a"), await shop["s2"]("b")]

    store.fail("finish_saga", when="after")
    with pytest.raises(EffectStoreError, match="finish_saga"):
        await order()
    saga = await saga_store(ledger).get_saga("lost-reply")
    assert saga is not None and saga.status is SagaStatus.COMPLETED
    assert await order() == [{"done": "s1:a"}, {"done": "s2:b"}]
    assert shop.log == ["s1", "s2"]
