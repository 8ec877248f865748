"""begin()/commit()/heartbeat() for workers that drive the lifecycle by hand."""

from __future__ import annotations

import pytest

from agent_ledger import (
    EffectError,
    EffectFailedError,
    EffectLedgerValidationError,
    EffectStatus,
    ToolCall,
)
from agent_ledger.effects import CommitFailed, CommitSucceeded
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="email.send", args={"to": "a@example.com"})


async def test_begin_fresh_then_commit_then_replay(harness: StoreHarness) -> None:
    """A fresh begin owns the effect; after commit, begin returns the cached result."""
    ledger = harness.ledger()
    first = await ledger.begin(CALL)
    assert (first.cached, first.idempotency_status, first.cached_result) == (False, "fresh", None)
    assert first.effect.status is EffectStatus.PROCESSING
    assert await ledger.commit(first.effect.id, CommitSucceeded(result={"id": 7}), attempt=1)
    again = await ledger.begin(CALL)
    assert (again.cached, again.idempotency_status, again.cached_result) == (
        True,
        "replayed",
        {"id": 7},
    )
    assert again.effect.dedup_count == 1


async def test_first_commit_wins(harness: StoreHarness) -> None:
    """A second commit of the same effect returns False and changes nothing."""
    ledger = harness.ledger()
    begun = await ledger.begin(CALL)
    assert await ledger.commit(begun.effect.id, CommitSucceeded(result="first"))
    assert not await ledger.commit(begun.effect.id, CommitSucceeded(result="second"))
    assert not await ledger.commit(begun.effect.id, CommitFailed(error=EffectError("late")))
    effect = await ledger.get_effect(begun.effect.id)
    assert effect is not None and (effect.status, effect.result) == (
        EffectStatus.SUCCEEDED,
        "first",
    )


async def test_commit_failed_then_begin_raises(harness: StoreHarness) -> None:
    """A committed failure makes later begins raise EffectFailedError."""
    ledger = harness.ledger()
    begun = await ledger.begin(CALL)
    error = EffectError(message="smtp down", code="smtp_503")
    assert await ledger.commit(begun.effect.id, CommitFailed(error=error))
    with pytest.raises(EffectFailedError) as info:
        await ledger.begin(CALL)
    assert (info.value.message, info.value.code) == ("smtp down", "smtp_503")


async def test_commit_of_unknown_effect_returns_false(harness: StoreHarness) -> None:
    """Committing an id the store never issued is not an error, just not a transition."""
    ledger = harness.ledger()
    assert not await ledger.commit("00000000-0000-0000-0000-000000000000", CommitSucceeded())


async def test_commit_with_a_non_json_result_stores_nothing(harness: StoreHarness) -> None:
    """A bad result is rejected before the store is touched; a good commit still works."""
    ledger = harness.ledger()
    begun = await ledger.begin(CALL)
    with pytest.raises(EffectLedgerValidationError, match="result"):
        await ledger.commit(begun.effect.id, CommitSucceeded(result={1, 2}))  # type: ignore[arg-type]
    effect = await ledger.get_effect(begun.effect.id)
    assert effect is not None and effect.status is EffectStatus.PROCESSING
    assert await ledger.commit(begun.effect.id, CommitSucceeded(result=[1, 2]))


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        ((123, CommitSucceeded()), {}, "effect_id"),
        (("id", {"result": 1}), {}, "outcome"),
        (("id", CommitFailed(error="boom")), {}, "outcome"),  # type: ignore[arg-type]
        (("id", CommitSucceeded()), {"attempt": 0}, "attempt"),
    ],
)
async def test_commit_rejects_malformed_arguments(
    harness: StoreHarness, args: tuple[object, ...], kwargs: dict[str, object], field: str
) -> None:
    """Wrong types for commit() are named in the error."""
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError) as info:
        await ledger.commit(*args, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


async def test_heartbeat_is_accepted_only_from_the_holder(harness: StoreHarness) -> None:
    """heartbeat() is True for the current attempt, False for others or after commit."""
    ledger = harness.ledger()
    begun = await ledger.begin(CALL)
    effect = begun.effect
    assert await ledger.heartbeat(effect.id, effect.attempt)
    assert not await ledger.heartbeat(effect.id, effect.attempt + 1)
    await ledger.commit(effect.id, CommitSucceeded())
    assert not await ledger.heartbeat(effect.id, effect.attempt)


async def test_get_and_find_return_the_same_effect(harness: StoreHarness) -> None:
    """get_effect(id) and find_by_idem_key(key) agree; unknown ones are None."""
    ledger = harness.ledger()
    begun = await ledger.begin(CALL)
    assert await ledger.get_effect(begun.effect.id) == await ledger.find_by_idem_key(
        begun.effect.idem_key
    )
    assert await ledger.find_by_idem_key("0" * 64) is None
    assert await ledger.get_effect("00000000-0000-0000-0000-000000000000") is None
