"""The SagaStore steps, on every store: insert-or-get, fenced claims, heartbeats,
the owner's moves, and steps recorded only by the owner of a running saga."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import EffectLedgerValidationError
from agent_ledger.effects import EffectError
from agent_ledger.stores.saga_base import (
    NewSaga,
    NewSagaStep,
    SagaRecord,
    SagaStatus,
    SagaStore,
)
from tests.harness import StoreHarness

G = SagaStatus
LEASE = 1_000


def _sagas(harness: StoreHarness) -> SagaStore:
    store = harness.store
    assert isinstance(store, SagaStore)
    return store


def _new(saga_id: str = "order-42", lease_ms: int = LEASE) -> NewSaga:
    return NewSaga(saga_id, "worker-a", lease_ms, None, "continue")


def _step(position: int, tool: str = "payments.charge", group: int | None = None) -> NewSagaStep:
    return NewSagaStep(
        position,
        position if group is None else group,
        tool,
        f"key-{position}",
        "payments.refund",
        f"undo-{position}",
        "succeeded",
    )


async def test_begin_inserts_once_and_then_reads(harness: StoreHarness) -> None:
    store = _sagas(harness)
    first, again = await asyncio.gather(store.begin_saga(_new()), store.begin_saga(_new()))
    assert sorted([first.created, again.created]) == [False, True]
    saga = (await store.begin_saga(_new())).saga
    assert (saga.status, saga.attempt, saga.owner) == (G.RUNNING, 1, "worker-a")
    assert saga.lease_ms == LEASE
    assert saga.on_compensation_failure == "continue" and saga.abandon_after_ms is None
    assert saga.completed_at is None and saga.error is None
    assert await store.get_saga("order-42") == saga
    assert await store.get_saga("nothing") is None


async def test_a_claim_needs_a_stale_heartbeat_and_has_one_winner(harness: StoreHarness) -> None:
    store = _sagas(harness)
    await store.begin_saga(_new())

    async def claim(idle_ms: int) -> SagaRecord | None:
        return await store.claim_saga(
            "order-42", expect=G.RUNNING, then=G.RUNNING, lease_ms=LEASE, idle_ms=idle_ms, owner="b"
        )

    assert await claim(0) is None, "the lease is live"
    await harness.age(LEASE + 100)
    assert await claim(60_000) is None, "not idle enough"
    won = await asyncio.gather(*(claim(0) for _ in range(4)))
    [winner] = [w for w in won if w is not None]
    assert (winner.attempt, winner.owner, winner.status) == (2, "b", G.RUNNING)
    # The old owner is fenced out of every step.
    assert not await store.heartbeat_saga("order-42", attempt=1)
    assert await store.record_step("order-42", attempt=1, step=_step(0)) is None
    assert not await store.finish_saga(
        "order-42", attempt=1, expect=G.RUNNING, then=G.COMPLETED, error=None
    )
    assert await store.heartbeat_saga("order-42", attempt=2)
    assert await store.saga_steps("order-42") == []


async def test_a_claim_can_start_compensating_and_a_zero_lease_is_never_taken(
    harness: StoreHarness,
) -> None:
    store = _sagas(harness)
    await store.begin_saga(_new("pinned", lease_ms=0))
    await store.begin_saga(_new("abandoned"))
    await harness.age(LEASE * 10)

    async def claim(saga_id: str) -> SagaRecord | None:
        return await store.claim_saga(
            saga_id, expect=G.RUNNING, then=G.COMPENSATING, lease_ms=LEASE, idle_ms=0, owner="r"
        )

    assert await claim("pinned") is None
    taken = await claim("abandoned")
    assert taken is not None and taken.status is G.COMPENSATING
    assert await claim("abandoned") is None, "no longer running"


async def test_steps_are_recorded_by_the_owner_in_order_and_never_replaced(
    harness: StoreHarness,
) -> None:
    store = _sagas(harness)
    await store.begin_saga(_new())
    for position in (1, 0, 2):
        assert (await store.record_step("order-42", attempt=1, step=_step(position))) is not None
    kept = await store.record_step("order-42", attempt=1, step=_step(1, tool="other"))
    assert kept is not None and kept.tool == "payments.charge", "the first record stays"
    steps = await store.saga_steps("order-42")
    assert [s.position for s in steps] == [0, 1, 2]
    first = steps[0]
    assert (first.idem_key, first.compensation_key, first.compensate_if) == (
        "key-0",
        "undo-0",
        "succeeded",
    )
    assert await store.saga_steps("nothing") == []
    assert await store.record_step("nothing", attempt=1, step=_step(0)) is None


async def test_the_owner_moves_the_saga_and_a_finished_saga_takes_no_step(
    harness: StoreHarness,
) -> None:
    store = _sagas(harness)
    await store.begin_saga(_new())
    error = EffectError("card declined", "declined")
    assert await store.finish_saga(
        "order-42", attempt=1, expect=G.RUNNING, then=G.COMPENSATING, error=error
    )
    assert await store.record_step("order-42", attempt=1, step=_step(0)) is None
    assert await store.heartbeat_saga("order-42", attempt=1), "compensating is still owned"
    assert await store.finish_saga(
        "order-42", attempt=1, expect=G.COMPENSATING, then=G.COMPENSATED, error=None
    )
    saga = await store.get_saga("order-42")
    assert saga is not None and saga.status is G.COMPENSATED
    assert saga.error == error, "the error that started the rollback stays"
    assert saga.completed_at is not None
    assert not await store.heartbeat_saga("order-42", attempt=1)
    assert not await store.finish_saga(
        "order-42", attempt=1, expect=G.COMPENSATING, then=G.COMPENSATED, error=None
    )


async def test_a_move_the_table_forbids_is_refused_and_changes_nothing(
    harness: StoreHarness,
) -> None:
    store = _sagas(harness)
    await store.begin_saga(_new())
    with pytest.raises(EffectLedgerValidationError, match="from 'running' to 'compensated'"):
        await store.finish_saga(
            "order-42", attempt=1, expect=G.RUNNING, then=G.COMPENSATED, error=None
        )
    saga = await store.get_saga("order-42")
    assert saga is not None and saga.status is G.RUNNING


async def test_list_filters_by_status_newest_first(harness: StoreHarness) -> None:
    store = _sagas(harness)
    for name in ("a", "b", "c"):
        await store.begin_saga(_new(name))
        await harness.age(10)
    assert await store.finish_saga("b", attempt=1, expect=G.RUNNING, then=G.COMPLETED, error=None)
    assert [s.saga_id for s in await store.list_sagas()] == ["c", "b", "a"]
    running = await store.list_sagas(statuses=frozenset({G.RUNNING}))
    assert [s.saga_id for s in running] == ["c", "a"]
    assert [s.saga_id for s in await store.list_sagas(limit=1)] == ["c"]


async def test_claimable_selects_only_what_a_claim_takes_oldest_first_in_pages(
    harness: StoreHarness,
) -> None:
    """The store, not the caller, picks the sagas a recoverer can take: newer
    running sagas (live, or kept for a person) never hide an older dead one."""
    store = _sagas(harness)
    await store.begin_saga(NewSaga("gone", "w", LEASE, 5_000, "continue"))
    await harness.age(10)
    for name in ("dead-undo", "live-undo"):
        await store.begin_saga(_new(name))
        assert await store.finish_saga(
            name, attempt=1, expect=G.RUNNING, then=G.COMPENSATING, error=None
        )
        await harness.age(10)
    await store.begin_saga(NewSaga("not-yet", "w", LEASE, 60_000, "continue"))
    await store.begin_saga(_new("kept"))  # no abandon_after: listed, never claimed
    await store.begin_saga(_new("done"))
    assert await store.finish_saga(
        "done", attempt=1, expect=G.RUNNING, then=G.COMPLETED, error=None
    )
    await harness.age(6_000)
    assert await store.heartbeat_saga("live-undo", attempt=1)
    claimable = await store.claimable_sagas()
    assert [s.saga_id for s in claimable] == ["gone", "dead-undo"]
    [first] = await store.claimable_sagas(limit=1)
    [second] = await store.claimable_sagas(limit=1, after=(first.created_at, first.saga_id))
    assert (first.saga_id, second.saga_id) == ("gone", "dead-undo")
    assert await store.claimable_sagas(after=(second.created_at, second.saga_id)) == []
    for saga in claimable:  # each one is indeed claimable, and then no longer
        assert await store.claim_saga(
            saga.saga_id,
            expect=saga.status,
            then=saga.status,
            lease_ms=LEASE,
            idle_ms=saga.abandon_after_ms or 0,
            owner="r",
        )
    assert await store.claimable_sagas() == []


@pytest.mark.parametrize("limit", [0, -1, 1_001, True, 2.0, "5"])
async def test_a_bad_limit_is_refused_alike_by_every_store(
    harness: StoreHarness, limit: object
) -> None:
    """A negative LIMIT meant "every saga" in SQLite and a store error in PostgreSQL."""
    store = _sagas(harness)
    await store.begin_saga(_new())
    with pytest.raises(EffectLedgerValidationError, match="limit must be an int from 1 to 1000"):
        await store.list_sagas(limit=limit)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="limit must be an int from 1 to 1000"):
        await store.claimable_sagas(limit=limit)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="limit must be an int from 1 to 1000"):
        await harness.ledger().recover_sagas(limit=limit)  # type: ignore[arg-type]
    assert [s.saga_id for s in await store.list_sagas(limit=1_000)] == ["order-42"]
