"""`tx=` callers on PostgreSQL: they never lock a running worker's effect, and every
lock wait inside their transaction is bounded (issue 10, item 1)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agent_ledger import Effect, EffectStatus, RunOptions, ToolCall
from agent_ledger.errors import EffectInFlightError
from agent_ledger.options import DEFAULT_TX_LOCK_TIMEOUT_MS, ConcurrencyOptions, StaleOptions
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger

CALL = ToolCall(workflow_id="wf", tool="charge", args={"amount": 5})
AFTER_MS = 600


async def show_lock_timeout(tx: Any) -> str:
    cursor = await tx.execute("SHOW lock_timeout")
    row = await cursor.fetchone()
    return str(row[0])


async def test_a_tx_caller_does_not_block_a_running_workers_heartbeats_or_commit(
    pg: Any, dsn: str, schema: str
) -> None:
    """B's transaction stays open past A's stale window; A's heartbeats and commit land
    meanwhile, B fails fast, and the handler runs once."""
    caller = await PostgresStore.connect(dsn, schema=schema, min_size=1, max_size=2)
    worker = build_ledger(pg.store, defaults=RunOptions(stale=StaleOptions(after_ms=AFTER_MS)))
    ledger_b = build_ledger(caller)
    executions = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def handler(effect: Effect) -> str:
        nonlocal executions
        executions += 1
        started.set()
        await release.wait()
        return "charged by A"

    owner = asyncio.create_task(worker.run(CALL, handler))
    try:
        await started.wait()
        async with caller.transaction() as tx:
            began = time.monotonic()
            with pytest.raises(EffectInFlightError, match="another worker") as info:
                await asyncio.wait_for(ledger_b.run(CALL, handler, tx=tx), 5)
            assert time.monotonic() - began < 0.5
            assert info.value.status is EffectStatus.PROCESSING
            first = await pg.store.find(ledger_b.idem_key(CALL))
            await asyncio.sleep(2 * AFTER_MS / 1000)  # two stale windows, B's transaction open
            now = await pg.store.find(ledger_b.idem_key(CALL))
            assert now.heartbeat_at > first.heartbeat_at, "A's heartbeats landed"
            release.set()
            assert await asyncio.wait_for(owner, 2.0) == "charged by A"  # B still open
            await tx.execute("SELECT 1")
        assert executions == 1
        effect = await pg.store.find(ledger_b.idem_key(CALL))
        assert (effect.status, effect.attempt, effect.result) == (
            EffectStatus.SUCCEEDED,
            1,
            "charged by A",
        )
        # A tx= replay is read, not written: nothing counted it as a duplicate.
        assert effect.dedup_count == 0
    finally:
        release.set()
        await asyncio.gather(owner, return_exceptions=True)
        await caller.close()


@pytest.mark.parametrize("wait_timeout_ms", [500, None], ids=["wait_timeout_ms=500", "default"])
async def test_an_uncommitted_insert_elsewhere_bounds_the_wait(
    pg: Any, wait_timeout_ms: int | None
) -> None:
    """Another transaction inserted the key and has not committed: B gives up after about
    wait_timeout_ms (or the default), and its transaction stays usable and commits."""
    ledger = build_ledger(pg.store)
    options = RunOptions(
        concurrency=None
        if wait_timeout_ms is None
        else ConcurrencyOptions(wait_timeout_ms=wait_timeout_ms)
    )
    bound_s = (wait_timeout_ms or DEFAULT_TX_LOCK_TIMEOUT_MS) / 1000
    other = ToolCall(workflow_id="wf", tool="after", args={})
    async with pg.store.transaction() as holder:
        await ledger.begin(CALL, tx=holder)  # inserted, not committed: the row is locked
        async with pg.store.transaction() as tx:
            await tx.execute("SET LOCAL lock_timeout = '7s'")
            began = time.monotonic()
            with pytest.raises(EffectInFlightError, match="another transaction") as info:
                await asyncio.wait_for(ledger.run(CALL, lambda e: "B", options, tx=tx), 5)
            waited = time.monotonic() - began
            assert bound_s * 0.9 <= waited < bound_s + 0.5, waited
            assert info.value.status is None
            assert info.value.lock_timeout_ms == (wait_timeout_ms or DEFAULT_TX_LOCK_TIMEOUT_MS)
            assert await show_lock_timeout(tx) == "7s"  # the caller's own setting is back
            assert await ledger.run(other, lambda e: "later", tx=tx) == "later"
    assert await ledger.run(other, lambda e: "again") == "later"  # B's transaction committed
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.PROCESSING


async def test_claiming_an_approved_effect_another_transaction_claimed_is_bounded(
    pg: Any,
) -> None:
    """An approved effect claimed (not yet committed) inside another transaction: B's claim
    waits about wait_timeout_ms, then fails; the first transaction runs it once."""
    ledger = build_ledger(pg.store)
    ran: list[str] = []
    pending = asyncio.create_task(
        ledger.run(
            CALL,
            lambda e: "never",
            RunOptions(
                requires_approval=True, concurrency=ConcurrencyOptions(approval_timeout_ms=10)
            ),
        )
    )
    with pytest.raises(Exception, match="approval"):
        await pending
    assert await ledger.approve(ledger.idem_key(CALL), by="ops")
    options = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=300))
    claimed, release = asyncio.Event(), asyncio.Event()

    async def first(effect: Effect) -> str:
        ran.append("first")
        claimed.set()
        await release.wait()
        return "first"

    async def in_first_transaction() -> object:
        async with pg.store.transaction() as tx:
            return await ledger.run(CALL, first, tx=tx)

    holder = asyncio.create_task(in_first_transaction())
    try:
        await claimed.wait()
        async with pg.store.transaction() as tx:
            began = time.monotonic()
            with pytest.raises(EffectInFlightError, match="another transaction"):
                second = ledger.run(CALL, lambda e: ran.append("second"), options, tx=tx)
                await asyncio.wait_for(second, 5)
            assert 0.25 <= time.monotonic() - began < 0.8
            await tx.execute("SELECT 1")
        release.set()
        assert await holder == "first"
    finally:
        release.set()
        await asyncio.gather(holder, return_exceptions=True)
    assert ran == ["first"]
    assert await ledger.run(CALL, lambda e: "x") == "first"


async def test_an_insert_committed_while_waiting_is_read_back(pg: Any) -> None:
    """The other transaction commits its insert while B waits on it: B reads the committed
    effect (held elsewhere: EffectInFlightError with its status), not a lock timeout."""
    ledger = build_ledger(pg.store)
    options = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=3_000))
    inserted, commit = asyncio.Event(), asyncio.Event()

    async def other_transaction() -> None:
        async with pg.store.transaction() as holder:
            await ledger.begin(CALL, tx=holder)
            inserted.set()
            await commit.wait()

    holder = asyncio.create_task(other_transaction())
    try:
        await inserted.wait()
        asyncio.get_running_loop().call_later(0.3, commit.set)
        async with pg.store.transaction() as tx:
            began = time.monotonic()
            with pytest.raises(EffectInFlightError, match="another worker") as info:
                await asyncio.wait_for(ledger.run(CALL, lambda e: "B", options, tx=tx), 5)
            assert 0.25 <= time.monotonic() - began < 2.0
            assert info.value.status is EffectStatus.PROCESSING
    finally:
        commit.set()
        await holder
