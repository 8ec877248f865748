"""Every transition, allowed or not, through the public API of every store."""

from __future__ import annotations

import itertools

import pytest

from agent_ledger import EffectError, EffectLedger, EffectStatus, ToolCall
from agent_ledger.decisions import ambiguous_error
from agent_ledger.effects import CommitFailed, CommitSucceeded
from agent_ledger.status import REOPENABLE, can_transition
from tests.approvals import make_parked, make_pending
from tests.harness import StoreHarness

S = EffectStatus
CALL = ToolCall(workflow_id="wf", tool="deploy", args={"v": 2})


async def put_in(
    ledger: EffectLedger, status: S, harness: StoreHarness | None = None
) -> tuple[str, str]:
    """Drive a fresh effect into ``status`` using only the public API (with
    ``harness``, ``requires_approval`` is a parked effect, else an approval)."""
    if status is S.REQUIRES_APPROVAL and harness is not None:
        # Parked (an ambiguous attempt): every edge out of requires_approval,
        # resolve's included, applies to it.
        parked = await make_parked(ledger, CALL, harness.age)
        return parked.idem_key, parked.id
    if status in (S.REQUIRES_APPROVAL, S.READY, S.DENIED):
        pending = await make_pending(ledger, CALL)
        key, effect_id = pending.idem_key, pending.id
        if status is S.READY:
            assert await ledger.approve(key)
        elif status is S.DENIED:
            assert await ledger.deny(key)
        found = await ledger.find_by_idem_key(key)
        assert found is not None and found.status is status
        return key, effect_id
    begun = await ledger.begin(CALL)
    key, effect_id = begun.effect.idem_key, begun.effect.id
    if status is S.SUCCEEDED:
        assert await ledger.commit(effect_id, CommitSucceeded(result=1))
    elif status is S.FAILED:
        assert await ledger.commit(effect_id, CommitFailed(error=EffectError("x")))
    elif status is S.CANCELED:
        assert await ledger.cancel(key)
    found = await ledger.find_by_idem_key(key)
    assert found is not None and found.status is status
    return key, effect_id


async def attempt(
    harness: StoreHarness, ledger: EffectLedger, key: str, effect_id: str, target: S
) -> bool:
    """Ask for ``target`` the way the ledger would; True if the store moved."""
    current = await ledger.find_by_idem_key(key)
    assert current is not None
    if current.status is S.REQUIRES_APPROVAL and target in (S.SUCCEEDED, S.FAILED):
        # A person records what happened downstream (only resolve does this).
        if target is S.SUCCEEDED:
            return await ledger.resolve(key, result={"charged": True}, by="ops")
        return await ledger.resolve(key, error=EffectError("declined", "card_declined"), by="ops")
    if current.status is S.PROCESSING and target is S.REQUIRES_APPROVAL:
        # Only a park: the holder recorded its handler's start under
        # on_stale="park", then went silent for its whole lease.
        assert await harness.store.mark_started(effect_id, attempt=current.attempt, worker="w")
        await harness.age(60_000)
        return (
            await harness.store.park(key, stale_after_ms=1_000, error=ambiguous_error())
        ).claimed
    if target is S.SUCCEEDED:
        return await ledger.commit(effect_id, CommitSucceeded(result=2))
    if target is S.FAILED:
        return await ledger.commit(effect_id, CommitFailed(error=EffectError("y")))
    if target is S.REQUIRES_APPROVAL:
        return await ledger.request_approval(key)
    current = await ledger.find_by_idem_key(key)
    assert current is not None
    if target is S.PROCESSING and current.status is S.FAILED:
        # Only a later call's retry, fenced by the failed attempt (the engine
        # asks for it after a failure the tool declared retryable).
        outcome = await harness.store.retry_failed(key, attempt=current.attempt, lease_ms=1_000)
        return outcome.claimed
    if target is S.READY and current.status in REOPENABLE:
        # A finished effect goes back only by a person's reopen, never approve().
        return await ledger.reopen(key, by="ops", reason="run it again")
    if target is S.READY and current.status is S.PROCESSING:
        # Only its holder gives a processing effect back (a release, fenced).
        return await harness.store.release(effect_id, attempt=current.attempt)
    if target is S.READY:
        return await ledger.approve(key)
    if target is S.DENIED:
        return await ledger.deny(key)
    if target is S.CANCELED:
        return await ledger.cancel(key)
    # processing: only a claim gets there: ready -> processing (an approved run), or
    # processing -> processing (a takeover, once the holder's heartbeat is stale).
    if current.status is S.PROCESSING:
        await harness.age(60_000)
    return (await harness.store.claim(key, stale_after_ms=1_000)).claimed


@pytest.mark.parametrize(("source", "target"), list(itertools.product(S, S)))
async def test_store_allows_exactly_the_table(harness: StoreHarness, source: S, target: S) -> None:
    """A requested move happens iff the table allows it; otherwise nothing changes."""
    ledger = harness.ledger()
    key, effect_id = await put_in(ledger, source, harness)
    before = await ledger.find_by_idem_key(key)
    moved = await attempt(harness, ledger, key, effect_id, target)
    after = await ledger.find_by_idem_key(key)
    assert before is not None and after is not None
    assert moved == can_transition(source, target)
    if moved:
        assert after.status is target
        assert after.updated_at >= before.updated_at
        assert (after.completed_at is not None) == target.is_terminal
    else:
        assert after == before


async def test_terminal_effects_never_change(harness: StoreHarness) -> None:
    """No API call but a person's reopen moves a terminal effect; its receipt stays identical."""
    ledger = harness.ledger()
    for status in (S.SUCCEEDED, S.FAILED, S.DENIED, S.CANCELED):
        call = ToolCall(workflow_id=status.value, tool="t")
        if status is S.DENIED:
            effect = await make_pending(ledger, call)
            await ledger.deny(effect.idem_key)
        else:
            effect = (await ledger.begin(call)).effect
        key = effect.idem_key
        if status is S.SUCCEEDED:
            await ledger.commit(effect.id, CommitSucceeded(result="r"))
        elif status is S.FAILED:
            await ledger.commit(effect.id, CommitFailed(error=EffectError("e")))
        elif status is S.CANCELED:
            await ledger.cancel(key)
        receipt = await ledger.find_by_idem_key(key)
        results = [
            await ledger.approve(key),
            await ledger.deny(key),
            await ledger.cancel(key),
            await ledger.request_approval(key),
            await ledger.commit(effect.id, CommitSucceeded(result="other")),
            (await harness.store.claim(key, stale_after_ms=1)).claimed,
        ]
        assert results == [False] * 6
        assert await ledger.find_by_idem_key(key) == receipt


async def test_approve_denied_and_deny_approved_return_false(harness: StoreHarness) -> None:
    """Decisions are final: the other decision cannot overwrite them."""
    ledger = harness.ledger()
    key, _ = await put_in(ledger, S.DENIED)
    assert not await ledger.approve(key)
    other = await make_pending(ledger, ToolCall(workflow_id="wf2", tool="deploy"))
    assert await ledger.approve(other.idem_key)
    assert not await ledger.deny(other.idem_key)


async def test_approving_a_processing_effect_is_refused(harness: StoreHarness) -> None:
    """processing -> ready is a release by its holder, never an approval: approve()
    returns False and changes nothing, while the holder may be running its handler."""
    ledger = harness.ledger()
    key, _ = await put_in(ledger, S.PROCESSING)
    before = await ledger.find_by_idem_key(key)
    assert not await ledger.approve(key, by="someone")
    assert await harness.store.transition(key, target=S.READY) is None
    assert await ledger.find_by_idem_key(key) == before


async def test_admin_calls_on_unknown_keys_return_false(harness: StoreHarness) -> None:
    """approve/deny/cancel/request_approval of a key never seen change nothing."""
    ledger = harness.ledger()
    unknown = "f" * 64
    assert [
        await ledger.approve(unknown),
        await ledger.deny(unknown, reason="x"),
        await ledger.cancel(unknown),
        await ledger.request_approval(unknown),
    ] == [False] * 4
    assert await harness.raw_count() == 0
