"""``EffectLedgerOptions(legacy_keys=True)`` and ``Store.find_legacy``, on every store.

A mapping is what ``agent-ledger import-0.2`` records for each row it brings
over (0.2.x's key -> the imported effect's key); here ``record_legacy``
records it directly, so each store's step is tested without a 0.2.x
database (tests/legacy/ does it with one, written by the real 0.2.1).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol, cast

import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    RunOptions,
    ToolCall,
)
from agent_ledger.effects import Effect
from agent_ledger.errors import EffectLedgerValidationError, EffectPayloadMismatchError
from agent_ledger.legacy.keys import legacy_key_of, legacy_key_or_none
from agent_ledger.stores.base import Store
from agent_ledger.testing import FaultyStore
from tests.harness import StoreHarness

#: What 0.2.x ran (and import-0.2 brought over, keyed by its rebuilt call).
IMPORTED = ToolCall("wf-legacy", "resize", {"scale": 2, "note": "x"})
#: The same call as a new worker makes it: 0.2.x could not tell 2.0 from 2,
#: this version can, so the two keys differ here.
AS_FLOAT = ToolCall("wf-legacy", "resize", {"scale": 2.0, "note": "x"})


class Recording(Protocol):
    async def record_legacy(self, legacy_key: str, idem_key: str) -> bool: ...


def recorder(store: Store) -> Recording:
    """Every store of this package records mappings; the Protocol does not ask it."""
    assert hasattr(store, "record_legacy")
    return cast(Recording, store)


def never(effect: Effect) -> object:
    raise AssertionError("the handler ran")


def legacy_ledger(store: Store, *, on: bool = True) -> EffectLedger:
    return EffectLedger(EffectLedgerOptions(store=store, legacy_keys=on))


async def imported(harness: StoreHarness, call: ToolCall = IMPORTED, result: object = "r") -> str:
    """An effect as import-0.2 leaves it: run under its rebuilt call, and mapped."""
    ledger = harness.ledger()
    assert await ledger.run(call, lambda effect: result) == result
    key = ledger.idem_key(call)
    assert await recorder(harness.store).record_legacy(legacy_key_of(call), key)
    return key


async def test_find_legacy_reads_the_mapped_effect(harness: StoreHarness) -> None:
    key = await imported(harness)
    store = harness.store
    found = await store.find_legacy(legacy_key_of(AS_FLOAT))
    assert found is not None and found == await store.find(key)
    assert await store.find_legacy("0" * 64) is None
    # The first mapping stays: a second import changes nothing.
    assert not await recorder(store).record_legacy(legacy_key_of(IMPORTED), "f" * 64)
    again = await store.find_legacy(legacy_key_of(IMPORTED))
    assert again is not None and again.idem_key == key
    # Inside a caller's transaction too.
    async with store.transaction() as tx:
        inside = await store.find_legacy(legacy_key_of(IMPORTED), tx=tx)
    assert inside is not None and inside.idem_key == key


async def test_a_mapping_whose_effect_is_gone_finds_nothing(harness: StoreHarness) -> None:
    store = harness.store
    assert await recorder(store).record_legacy("1" * 64, "2" * 64)
    assert await store.find_legacy("1" * 64) is None
    await imported(harness)
    await harness.age(120_000)
    assert (
        await store.purge(
            older_than=timedelta(seconds=60), statuses=frozenset({EffectStatus.SUCCEEDED})
        )
        == 1
    )
    assert await store.find_legacy(legacy_key_of(IMPORTED)) is None
    # ...so the call runs under its own key, as without the option.
    assert await legacy_ledger(store).run(AS_FLOAT, lambda effect: "again") == "again"


async def test_a_call_is_answered_by_the_effect_its_0_2_key_was_imported_as(
    harness: StoreHarness,
) -> None:
    key = await imported(harness, result={"w": 0.1})
    ledger = legacy_ledger(harness.store)
    assert ledger.idem_key(AS_FLOAT) != key
    ran: list[str] = []

    def handler(effect: Effect) -> object:
        ran.append("ran")
        return "again"

    assert await ledger.run(AS_FLOAT, handler) == {"w": 0.1}
    begun = await ledger.begin(AS_FLOAT)
    assert begun.cached and begun.cached_result == {"w": 0.1} and begun.effect.idem_key == key
    assert ran == []
    effect = await harness.store.find(key)
    assert effect is not None and effect.dedup_count == 2
    assert await harness.store.find(ledger.idem_key(AS_FLOAT)) is None
    # Inside a caller's transaction as well.
    async with harness.store.transaction() as tx:
        assert await ledger.run(AS_FLOAT, handler, tx=tx) == {"w": 0.1}
    assert ran == []
    # Without the option it is a new call here, and runs.
    assert await legacy_ledger(harness.store, on=False).run(AS_FLOAT, handler) == "again"
    assert ran == ["ran"]


async def test_an_imported_effect_waiting_for_a_person_is_waited_on(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    ask = RunOptions(requires_approval=True, wait_for_approval=False)
    with pytest.raises(ApprovalPendingError) as asked:
        await ledger.run(IMPORTED, lambda e: "x", ask)
    pending = asked.value.effect
    assert await recorder(harness.store).record_legacy(legacy_key_of(IMPORTED), pending.idem_key)
    legacy = legacy_ledger(harness.store)
    with pytest.raises(ApprovalPendingError) as info:
        await legacy.run(AS_FLOAT, lambda e: "x", RunOptions(wait_for_approval=False))
    assert info.value.effect.idem_key == pending.idem_key
    assert await ledger.approve(pending.idem_key)
    # Approved: it runs once, with the args recorded when it was asked for.
    seen: list[object] = []

    def handler(effect: Effect) -> str:
        seen.append(effect.args["scale"])
        return "ran"

    assert await legacy.run(AS_FLOAT, handler) == "ran"
    assert await legacy.run(AS_FLOAT, handler) == "ran"
    assert seen == [2] and type(seen[0]) is int


def by_scale(note: str, *, validate: bool) -> ToolCall:
    """A call keyed by ``scale`` alone (0.2.x's ``idempotency_keys``)."""
    args: dict[str, object] = {"scale": 2.0 if validate else 2, "note": note}
    return ToolCall(
        "wf-legacy",
        "resize",
        args,  # type: ignore[arg-type]
        idempotency_keys=["scale"],
        validate_keys="all" if validate else None,
    )


async def test_validate_keys_compares_as_0_2_did(harness: StoreHarness) -> None:
    """1 and 1.0 agree (0.2.x kept them alike); any other difference is refused."""
    await imported(harness, by_scale("x", validate=False))
    ledger = legacy_ledger(harness.store)
    assert await ledger.run(by_scale("x", validate=True), never) == "r"
    with pytest.raises(EffectPayloadMismatchError) as info:
        await ledger.run(by_scale("y", validate=True), never)
    assert info.value.fields == ("note",)


async def test_another_calls_receipt_under_a_colliding_0_2_key_is_not_used(
    harness: StoreHarness,
) -> None:
    """0.2.x keyed workflow "team|ops" + tool "notify" like "team" + "ops|notify"."""
    first = ToolCall("team|ops", "notify", {"msg": "deploy"})
    other = ToolCall("team", "ops|notify", {"msg": "deploy"})
    assert legacy_key_of(first) == legacy_key_of(other)
    await imported(harness, first, {"sent": 1})
    ledger = legacy_ledger(harness.store)
    assert await ledger.run(other, lambda e: "ran other") == "ran other"
    assert await ledger.run(first, never) == {"sent": 1}


async def test_off_by_default_it_reads_nothing(harness: StoreHarness) -> None:
    await imported(harness)
    counted = FaultyStore(harness.store)
    default = EffectLedger(EffectLedgerOptions(store=counted))
    assert await default.run(AS_FLOAT, lambda e: "new") == "new"
    await default.begin(ToolCall("wf", "t", {"n": 1}))
    assert counted.calls["find_legacy"] == 0
    on = legacy_ledger(counted)
    # One read per call. The imported effect answers even though the call
    # has run under its own key meanwhile: the mapping is asked first.
    assert await on.run(AS_FLOAT, never) == "r"
    assert counted.calls["find_legacy"] == 1


async def test_calls_0_2_could_not_make_are_not_looked_up(harness: StoreHarness) -> None:
    counted = FaultyStore(harness.store)
    big = ToolCall("wf", "t", {"n": 2**60})
    assert legacy_key_or_none(big) is None
    assert await legacy_ledger(counted).run(big, lambda e: "ran") == "ran"
    assert counted.calls["find_legacy"] == 0


def test_legacy_keys_must_be_a_bool(harness: StoreHarness) -> None:
    with pytest.raises(EffectLedgerValidationError, match="legacy_keys must be a bool"):
        EffectLedgerOptions(store=harness.store, legacy_keys=1)  # type: ignore[arg-type]
