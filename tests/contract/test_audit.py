"""Audit queries: listing with keyset pages, pending approvals, stats, purge, decisions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_ledger import (
    Effect,
    EffectError,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
    ToolCall,
)
from agent_ledger.effects import CommitFailed, CommitSucceeded
from tests.approvals import make_pending
from tests.harness import StoreHarness


async def make(
    ledger: EffectLedger,
    workflow: str,
    tool: str,
    i: int,
    status: EffectStatus = EffectStatus.SUCCEEDED,
) -> Effect:
    """Create one effect in the given status through the public API."""
    call = ToolCall(workflow_id=workflow, tool=tool, args={"i": i})
    if status is EffectStatus.REQUIRES_APPROVAL:
        return await make_pending(ledger, call)
    effect = (await ledger.begin(call)).effect
    if status is EffectStatus.SUCCEEDED:
        await ledger.commit(effect.id, CommitSucceeded(result=i))
    elif status is EffectStatus.FAILED:
        await ledger.commit(effect.id, CommitFailed(error=EffectError("x")))
    stored = await ledger.get_effect(effect.id)
    assert stored is not None
    return stored


async def test_list_is_newest_first_and_filters_combine(harness: StoreHarness) -> None:
    """Filters by workflow, tool and status narrow the list; order is (created_at, id) desc."""
    ledger = harness.ledger()
    made = []
    for i in range(6):
        made.append(await make(ledger, f"wf-{i % 2}", "a" if i < 3 else "b", i))
        await harness.age(10)
    made.append(await make(ledger, "wf-0", "a", 99, EffectStatus.FAILED))
    everything = (await ledger.list_effects()).effects
    assert [e.id for e in everything] == [
        e.id for e in sorted(made, key=lambda e: (e.created_at, e.id), reverse=True)
    ]
    wf0 = (await ledger.list_effects(workflow_id="wf-0")).effects
    assert {e.workflow_id for e in wf0} == {"wf-0"} and len(wf0) == 4
    narrowed = (await ledger.list_effects(workflow_id="wf-0", tool="a", status="succeeded")).effects
    assert sorted(e.args_canonical for e in narrowed) == ['{"i":0}', '{"i":2}']
    failed = (await ledger.list_effects(status=EffectStatus.FAILED)).effects
    assert [e.args_canonical for e in failed] == ['{"i":99}']


async def test_since_and_until_bound_created_at(harness: StoreHarness) -> None:
    """since is inclusive, until exclusive, both on created_at."""
    ledger = harness.ledger()
    old = await make(ledger, "w", "t", 1)
    await harness.age(60_000)
    new = await make(ledger, "w", "t", 2)
    reread = await ledger.get_effect(old.id)  # re-read: aging may have moved its timestamps
    assert reread is not None and new is not None
    recent = (await ledger.list_effects(since=new.created_at)).effects
    assert [e.id for e in recent] == [new.id]
    earlier = (await ledger.list_effects(until=new.created_at)).effects
    assert [e.id for e in earlier] == [reread.id]


async def test_pages_are_stable_while_new_effects_arrive(harness: StoreHarness) -> None:
    """Following next_cursor visits every effect exactly once, even with inserts between pages."""
    ledger = harness.ledger()
    for i in range(7):
        await make(ledger, "w", "t", i)
    await harness.age(10)  # so the effect created mid-listing is strictly newer
    seen: list[str] = []
    page = await ledger.list_effects(limit=3)
    seen += [e.id for e in page.effects]
    await make(ledger, "w", "t", 100)  # newer than everything paged so far
    while page.next_cursor is not None:
        page = await ledger.list_effects(limit=3, cursor=page.next_cursor)
        seen += [e.id for e in page.effects]
    assert len(seen) == len(set(seen)) == 7


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "10"}, "limit"),
        ({"status": "paused"}, "status"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"since": "yesterday"}, "since"),
        ({"workflow_id": 7}, "workflow_id"),
    ],
)
async def test_bad_list_arguments_name_the_field(
    harness: StoreHarness, kwargs: dict[str, object], field: str
) -> None:
    """Each malformed filter raises EffectLedgerValidationError naming it."""
    with pytest.raises(EffectLedgerValidationError) as info:
        await harness.ledger().list_effects(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


async def test_pending_approvals_lists_only_waiting_effects(harness: StoreHarness) -> None:
    """pending_approvals() is the requires_approval effects, newest first."""
    ledger = harness.ledger()
    waiting = await make(ledger, "w", "deploy", 1, EffectStatus.REQUIRES_APPROVAL)
    await make(ledger, "w", "deploy", 2)
    assert [e.id for e in await ledger.pending_approvals()] == [waiting.id]


async def test_stats_count_by_status_and_tool_with_duplicates(harness: StoreHarness) -> None:
    """stats() counts every effect once, by status and tool, and sums duplicates."""
    ledger = harness.ledger()
    await make(ledger, "w", "a", 1)
    await make(ledger, "w", "a", 2, EffectStatus.FAILED)
    await make(ledger, "w", "b", 3, EffectStatus.REQUIRES_APPROVAL)
    for _ in range(3):
        await ledger.run(ToolCall(workflow_id="w", tool="a", args={"i": 1}), lambda e: None)
    stats = await ledger.stats()
    assert stats.total == 3
    assert stats.by_status[EffectStatus.SUCCEEDED] == 1
    assert stats.by_status[EffectStatus.FAILED] == 1
    assert stats.by_status[EffectStatus.REQUIRES_APPROVAL] == 1
    assert stats.by_status[EffectStatus.CANCELED] == 0
    assert dict(stats.by_tool) == {"a": 2, "b": 1}
    assert stats.duplicates == 3


async def test_purge_removes_old_terminal_effects_only(harness: StoreHarness) -> None:
    """purge() deletes terminal effects past the cutoff and never a live one."""
    ledger = harness.ledger()
    await make(ledger, "w", "t", 1)
    await make(ledger, "w", "t", 2, EffectStatus.FAILED)
    live = await make(ledger, "w", "t", 3, EffectStatus.PROCESSING)
    waiting = await make(ledger, "w", "t", 4, EffectStatus.REQUIRES_APPROVAL)
    await harness.age(2 * 86_400_000)
    fresh = await make(ledger, "w", "t", 5)
    assert await ledger.purge(older_than=timedelta(days=1)) == 2
    left = {e.id for e in (await ledger.list_effects()).effects}
    assert left == {live.id, waiting.id, fresh.id}
    assert await ledger.purge(older_than=timedelta(days=1)) == 0


async def test_purge_refuses_non_terminal_statuses(harness: StoreHarness) -> None:
    """Asking purge() for processing effects is an error and deletes nothing."""
    ledger = harness.ledger()
    await make(ledger, "w", "t", 1, EffectStatus.PROCESSING)
    await harness.age(86_400_000)
    with pytest.raises(EffectLedgerValidationError, match="terminal effects only"):
        await ledger.purge(timedelta(0), frozenset({EffectStatus.PROCESSING}))
    with pytest.raises(EffectLedgerValidationError, match="older_than"):
        await ledger.purge(timedelta(days=-1))
    assert await harness.raw_count() == 1


async def test_decisions_record_who_and_why(harness: StoreHarness) -> None:
    """approve(by, note) and deny(reason, by) are kept on the receipt with a time."""
    ledger = harness.ledger()
    one = await make(ledger, "w", "deploy", 1, EffectStatus.REQUIRES_APPROVAL)
    two = await make(ledger, "w", "deploy", 2, EffectStatus.REQUIRES_APPROVAL)
    assert await ledger.approve(one.idem_key, by="ada", note="looks fine")
    assert await ledger.deny(two.idem_key, reason="change freeze", by="grace")
    approved = await ledger.get_effect(one.id)
    denied = await ledger.get_effect(two.id)
    assert approved is not None and denied is not None
    assert (approved.decided_by, approved.decision_note) == ("ada", "looks fine")
    assert approved.decided_at is not None and approved.decided_at >= approved.created_at
    assert (denied.decided_by, denied.error) == ("grace", EffectError("change freeze", "denied"))
    with pytest.raises(EffectLedgerValidationError, match="by"):
        await ledger.cancel(one.idem_key, by=3)  # type: ignore[arg-type]
