"""Store steps called directly: the contract of the Store protocol on every store."""

from __future__ import annotations

from datetime import UTC

import pytest

from agent_ledger import EffectError, EffectLedgerValidationError, EffectStatus
from agent_ledger.effects import TryFailure
from agent_ledger.ids import is_effect_id
from agent_ledger.status import CLAIMABLE
from agent_ledger.stores.base import HeartbeatOutcome, Held, NewEffect, Store
from agent_ledger.stores.memory import MEMORY_SCHEMA_VERSION as SCHEMA_VERSION
from tests.contract.test_transitions import put_in
from tests.harness import StoreHarness

S = EffectStatus
NEW = NewEffect("ab" * 32, "wf", None, "deploy", "{}", None)
NOT_HELD = HeartbeatOutcome(frozenset(), frozenset())


@pytest.mark.parametrize("source", [S.PROCESSING, S.READY, S.REQUIRES_APPROVAL])
async def test_transition_refuses_processing(harness: StoreHarness, source: S) -> None:
    """Only a claim moves an effect into processing; transition() says so and changes nothing."""
    ledger = harness.ledger()
    key, _ = await put_in(ledger, source)
    before = await harness.store.find(key)
    with pytest.raises(EffectLedgerValidationError) as info:
        await harness.store.transition(key, target=S.PROCESSING)
    assert info.value.field == "target"
    assert "only claim()" in str(info.value) and "processing" in str(info.value)
    assert await harness.store.find(key) == before


WAITING = frozenset({S.REQUIRES_APPROVAL, S.READY})


@pytest.mark.parametrize("source", list(S))
async def test_transition_with_sources_moves_only_from_those(
    harness: StoreHarness, source: S
) -> None:
    """``sources`` narrows the compare-and-set: a cancel from {requires_approval, ready}
    never lands on an effect a worker claimed meanwhile (issue 12, a12)."""
    ledger = harness.ledger()
    key, _ = await put_in(ledger, source)
    before = await harness.store.find(key)
    moved = await harness.store.transition(key, target=S.CANCELED, sources=WAITING)
    after = await harness.store.find(key)
    assert after is not None
    if source in WAITING:
        assert moved is not None and moved.status is S.CANCELED and after == moved
    else:
        assert moved is None and after == before


@pytest.mark.parametrize(
    "sources", [frozenset(), frozenset({S.SUCCEEDED}), {S.READY}, frozenset({"ready"})]
)
async def test_transition_refuses_sources_it_could_not_move_from(
    harness: StoreHarness, sources: object
) -> None:
    """``sources`` may only narrow ``decision_sources(target)``: anything else is refused."""
    ledger = harness.ledger()
    key, _ = await put_in(ledger, S.REQUIRES_APPROVAL)
    before = await harness.store.find(key)
    with pytest.raises(EffectLedgerValidationError) as info:
        await harness.store.transition(key, target=S.CANCELED, sources=sources)  # type: ignore[arg-type]
    assert info.value.field == "sources"
    assert await harness.store.find(key) == before


@pytest.mark.parametrize("source", list(S))
async def test_claim_takes_exactly_the_claimable_statuses(harness: StoreHarness, source: S) -> None:
    """A claim moves an effect iff its status is in CLAIMABLE (processing: once stale)."""
    ledger = harness.ledger()
    key, _ = await put_in(ledger, source)
    before = await harness.store.find(key)
    assert before is not None
    fresh = await harness.store.claim(key, stale_after_ms=60_000)
    assert fresh.claimed == (source in CLAIMABLE and source is not S.PROCESSING)
    if source is S.PROCESSING:
        assert not (await harness.store.claim(key, stale_after_ms=0)).claimed
        await harness.age(120_000)
        assert (await harness.store.claim(key, stale_after_ms=60_000)).claimed
    after = await harness.store.find(key)
    assert after is not None
    if source in CLAIMABLE:
        assert after.status is S.PROCESSING and after.attempt == before.attempt + 1
    else:
        assert after == before


async def test_only_the_canonical_id_names_an_effect(harness: StoreHarness) -> None:
    """An id in any other spelling (uppercase, braces, no hyphens) names no effect."""
    begun = await harness.store.begin(NEW)
    effect = begun.effect
    assert is_effect_id(effect.id)
    assert await harness.store.get(effect.id) == effect
    for other in (effect.id.upper(), "{" + effect.id + "}", effect.id.replace("-", "")):
        assert await harness.store.get(other) is None
        assert await harness.store.heartbeat([Held(other, effect.attempt)]) == NOT_HELD
        assert not await harness.store.commit(
            other, attempt=effect.attempt, status=S.SUCCEEDED, result_json="1", error=None
        )
    assert await harness.store.find(effect.idem_key) == effect


async def test_schema_steps_are_part_of_every_store(harness: StoreHarness) -> None:
    """create_schema() is idempotent on a live store; check_schema() reports the version."""
    store = harness.store
    assert isinstance(store, Store)
    await store.create_schema()
    await store.create_schema()
    assert await store.check_schema() == SCHEMA_VERSION
    begun = await store.begin(NEW)
    await store.create_schema()
    assert await store.find(NEW.idem_key) == (await store.get(begun.effect.id))


async def test_one_heartbeat_batch_answers_for_each_effect(harness: StoreHarness) -> None:
    """A batch refreshes exactly the pairs still held; the rest come back in neither set."""
    store = harness.store
    held = (await store.begin(NEW)).effect
    done = (await store.begin(NEW._replace(idem_key="cd" * 32))).effect
    assert await store.commit(
        done.id, attempt=done.attempt, status=S.SUCCEEDED, result_json="1", error=None
    )
    await harness.age(1_000)
    batch = [
        Held(held.id, held.attempt),
        Held(held.id, held.attempt + 1),  # a later attempt this worker does not hold
        Held(done.id, done.attempt),  # finished
        Held("00000000-0000-4000-8000-000000000000", 1),  # no such effect
        Held("not-an-id", 1),
    ]
    outcome = await store.heartbeat(batch)
    assert outcome == HeartbeatOutcome(frozenset({Held(held.id, held.attempt)}), frozenset())
    after = await store.get(held.id)
    assert after is not None and after.heartbeat_at > held.heartbeat_at
    assert await store.heartbeat([]) == NOT_HELD


async def test_record_try_counts_a_failed_try_for_its_holder_only(harness: StoreHarness) -> None:
    """+1 try and its failure in the history, fenced by status and attempt; the status,
    the outcome and updated_at stay; the holder's heartbeat is refreshed."""
    store = harness.store
    effect = (await store.begin(NEW)).effect
    assert (effect.tries, effect.history) == (0, ())
    await harness.age(1_000)
    aged = await store.get(effect.id)
    assert aged is not None
    error = EffectError("reset \x00 by peer", "ECONNRESET")
    assert await store.record_try(effect.id, attempt=1, error=error, error_type="ConnectionError")
    assert await store.record_try(
        effect.id, attempt=1, error=EffectError("again"), error_type="app.Flaky"
    )
    after = await store.get(effect.id)
    assert after is not None
    assert (after.status, after.tries, after.updated_at) == (S.PROCESSING, 2, aged.updated_at)
    assert after.heartbeat_at > aged.heartbeat_at
    first, second = after.history
    assert isinstance(first, TryFailure) and isinstance(second, TryFailure)
    assert (first.number, first.attempt, first.type) == (1, 1, "ConnectionError")
    assert (first.message, first.code) == ("reset \ufffd by peer", "ECONNRESET")
    assert (second.number, second.message, second.code) == (2, "again", None)
    assert first.at.tzinfo is UTC and aged.created_at <= first.at <= second.at
    for attempt in (0, 2):
        assert not await store.record_try(
            effect.id, attempt=attempt, error=error, error_type="E"
        ), "another attempt's record is refused"
    for other in ("00000000-0000-4000-8000-000000000000", "not-an-id"):
        assert not await store.record_try(other, attempt=1, error=error, error_type="E")
    assert await store.commit(effect.id, attempt=1, status=S.SUCCEEDED, result_json="1", error=None)
    assert not await store.record_try(effect.id, attempt=1, error=error, error_type="E")
    done = await store.get(effect.id)
    assert done is not None and (done.tries, len(done.history)) == (3, 2)


@pytest.mark.parametrize("ends_try", [True, False])
async def test_a_commit_counts_its_try_unless_told_not_to(
    harness: StoreHarness, ends_try: bool
) -> None:
    store = harness.store
    effect = (await store.begin(NEW)).effect
    assert await store.commit(
        effect.id,
        attempt=1,
        status=S.FAILED,
        result_json=None,
        error=EffectError("no"),
        ends_try=ends_try,
    )
    after = await store.get(effect.id)
    assert after is not None and after.tries == (1 if ends_try else 0)
