"""Store.release: a holder gives its effect back unrun, fenced by its attempt."""

from __future__ import annotations

import pytest

from agent_ledger import EffectStatus
from agent_ledger.stores.base import NewEffect
from tests.contract.test_transitions import put_in
from tests.harness import StoreHarness

S = EffectStatus
NEW = NewEffect("cd" * 32, "wf", None, "deploy", "{}", None, lease_ms=5_000)


async def test_release_gives_a_fresh_effect_back_unrun(harness: StoreHarness) -> None:
    """processing at attempt 1 -> ready: no execution left, no start time; the
    attempt, lease and heartbeat stay as they were."""
    store = harness.store
    begun = (await store.begin(NEW)).effect
    await harness.age(10)
    before = await store.get(begun.id)
    assert before is not None and before.executions == 1 and before.started_at is not None
    assert await store.release(begun.id, attempt=1)
    after = await store.get(begun.id)
    assert after is not None
    assert (after.status, after.attempt, after.executions) == (S.READY, 1, 0)
    assert after.started_at is None and after.completed_at is None
    assert (after.lease_ms, after.heartbeat_at) == (before.lease_ms, before.heartbeat_at)
    assert after.updated_at > before.updated_at


async def test_a_released_effect_is_claimed_at_once(harness: StoreHarness) -> None:
    """No lease to wait out: the next claim takes it, whatever its window."""
    store = harness.store
    begun = (await store.begin(NEW)).effect
    assert await store.release(begun.id, attempt=1)
    claimed = await store.claim(NEW.idem_key, stale_after_ms=60_000)
    assert claimed.claimed and claimed.effect is not None
    assert (claimed.effect.status, claimed.effect.attempt, claimed.effect.executions) == (
        S.PROCESSING,
        2,
        1,
    )
    assert claimed.effect.started_at is not None


async def test_releasing_a_takeover_keeps_the_earlier_execution(harness: StoreHarness) -> None:
    """A taker that releases takes back only its own execution: the first one happened."""
    store = harness.store
    begun = (await store.begin(NEW)).effect
    await harness.age(NEW.lease_ms + 1)
    taken = await store.claim(NEW.idem_key, stale_after_ms=1_000)
    assert taken.claimed and taken.effect is not None and taken.effect.executions == 2
    assert await store.release(begun.id, attempt=2)
    after = await store.get(begun.id)
    assert after is not None
    assert (after.status, after.attempt, after.executions) == (S.READY, 2, 1)
    assert after.started_at is not None


async def test_release_is_fenced_by_the_attempt(harness: StoreHarness) -> None:
    """A stale holder's release (an older attempt) returns False and changes nothing."""
    store = harness.store
    begun = (await store.begin(NEW)).effect
    await harness.age(NEW.lease_ms + 1)
    assert (await store.claim(NEW.idem_key, stale_after_ms=1_000)).claimed
    before = await store.get(begun.id)
    assert not await store.release(begun.id, attempt=1)
    assert not await store.release(begun.id, attempt=3)
    assert await store.get(begun.id) == before


async def test_a_repeated_release_returns_false(harness: StoreHarness) -> None:
    """Not blindly repeatable: once it landed, the effect is ready, not processing."""
    store = harness.store
    begun = (await store.begin(NEW)).effect
    assert await store.release(begun.id, attempt=1)
    before = await store.get(begun.id)
    assert not await store.release(begun.id, attempt=1)
    assert await store.get(begun.id) == before


@pytest.mark.parametrize("source", [s for s in S if s is not S.PROCESSING])
async def test_release_moves_only_processing(harness: StoreHarness, source: S) -> None:
    """From any other status (a finished, pending or approved effect) nothing changes."""
    ledger = harness.ledger()
    key, effect_id = await put_in(ledger, source)
    before = await harness.store.find(key)
    assert before is not None
    assert not await harness.store.release(effect_id, attempt=before.attempt)
    assert await harness.store.find(key) == before


async def test_release_of_an_unknown_id_returns_false(harness: StoreHarness) -> None:
    begun = (await harness.store.begin(NEW)).effect
    for other in ("0b0e4f5e-1111-4222-8333-444455556666", "not an id", begun.id.upper()):
        assert not await harness.store.release(other, attempt=1)


async def test_release_wakes_the_keys_subscribers(harness: StoreHarness) -> None:
    """Waiters hear of a release as of any status change, so they claim at once."""
    store = harness.store
    begun = (await store.begin(NEW)).effect
    async with store.subscribe(NEW.idem_key) as changes:
        assert await store.release(begun.id, attempt=1)
        assert await changes.wait(5.0)
