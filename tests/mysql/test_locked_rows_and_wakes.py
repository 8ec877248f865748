"""Rows another transaction holds, and this process's waiters: what MySQLStore does
without row-lock waits and without LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import time

from agent_ledger import EffectStatus, ToolCall
from agent_ledger.stores.base import HeartbeatOutcome, Held, NewEffect
from tests.harness import MySQLHarness, mysql_backdoor


async def test_a_heartbeat_skips_a_row_locked_elsewhere_instead_of_waiting(
    my: MySQLHarness,
) -> None:
    """Another transaction holding one effect's row delays no heartbeat of the batch:
    that one is reported busy, the other refreshed; once the lock goes, both beat."""
    ledger = my.ledger()
    locked, free = [
        (await ledger.begin(ToolCall(workflow_id="wf", tool="t", args={"n": n}))).effect
        for n in range(2)
    ]
    other = await mysql_backdoor()
    try:
        await other.begin()
        async with other.cursor() as cur:
            await cur.execute(
                "SELECT 1 FROM agent_ledger_effects WHERE id = %s FOR UPDATE", (locked.id,)
            )
        started = time.monotonic()
        outcome = await asyncio.wait_for(
            my.store.heartbeat([Held(locked.id, 1), Held(free.id, 1)]), 5
        )
        assert time.monotonic() - started < 1.0
        await other.rollback()
    finally:
        other.close()
    assert outcome == HeartbeatOutcome(
        refreshed=frozenset({Held(free.id, 1)}), busy=frozenset({Held(locked.id, 1)})
    )
    again = await my.store.heartbeat([Held(locked.id, 1), Held(free.id, 1)])
    assert again.refreshed == {Held(locked.id, 1), Held(free.id, 1)} and not again.busy


async def test_a_flush_skips_a_locked_row_and_writes_it_later(my: MySQLHarness) -> None:
    """A duplicate count whose row another transaction holds is kept, not waited for,
    and written by a later flush."""
    ledger = my.ledger()
    call = ToolCall("wf", "t", {"n": 1})
    await ledger.run(call, lambda e: "done")
    await ledger.run(call, lambda e: "again")  # a replay: counted later, in a batch
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None and effect.dedup_count == 1  # this process sees its own count
    other = await mysql_backdoor()
    try:
        await other.begin()
        async with other.cursor() as cur:
            await cur.execute(
                "SELECT 1 FROM agent_ledger_effects WHERE id = %s FOR UPDATE", (effect.id,)
            )
        started = time.monotonic()
        await asyncio.wait_for(my.store.flush_counts(), 5)
        assert time.monotonic() - started < 1.0
        stored = await my._sql(
            "SELECT dedup_count FROM agent_ledger_effects WHERE id = %s", effect.id
        )
        assert stored == (0,)  # skipped: still this process's to write
        await other.rollback()
    finally:
        other.close()
    await my.store.flush_counts()
    assert await my._sql(
        "SELECT dedup_count FROM agent_ledger_effects WHERE id = %s", effect.id
    ) == (1,)


async def test_a_waiter_here_wakes_when_the_transaction_commits_not_before(
    my: MySQLHarness,
) -> None:
    """A decision made inside store.transaction() wakes this process's waiter once the
    block commits: the subscription is notified then, not at the statement."""
    new = NewEffect("k" * 64, "wf", None, "refund", "{}", None, requires_approval=True)
    await my.store.begin(new)
    async with my.store.subscribe(new.idem_key) as subscription:
        async with my.store.transaction() as tx:
            moved = await my.store.transition(new.idem_key, target=EffectStatus.READY, tx=tx)
            assert moved is not None and moved.status is EffectStatus.READY
            assert not await subscription.wait(0.05)  # not committed yet: nobody woken
        assert await subscription.wait(1.0)
