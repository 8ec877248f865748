"""wait_timeout_ms bounds a plain caller's wait on another transaction's lock (issue 26, item 4).

A caller outside any transaction meets a key that another caller's
``store.transaction()`` has inserted and not committed. On PostgreSQL and
MySQL the insert waits for that transaction's row lock; on SQLite for the
write lock (a second store: ``busy_timeout``) or for the store's own open
transaction (the same store: its gate). Whatever the store, the caller gets
``EffectTimeoutError`` within its ``wait_timeout_ms`` (plus a margin),
a cancellation of the waiting task ends it promptly, and neither leaves
anything stored: once the other transaction rolls back, the key is absent
and the next call runs the handler once. The process-crossing versions are
in ``tests/reliability/test_lock_waits_across_processes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_ledger import Effect, EffectLedger, EffectLedgerOptions, RunOptions, ToolCall
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.stores.base import Store
from agent_ledger.stores.sqlite import SqliteStore
from tests.harness import StoreHarness

WAIT_MS = 500
#: How long the other transaction holds the key: far past the caller's wait.
HOLD_S = 4.0
#: What a bounded wait may take past its limit, or a cancellation to land, on a loaded host.
MARGIN_S = 0.6
OPTIONS = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=WAIT_MS))


@contextlib.asynccontextmanager
async def other_writer(harness: StoreHarness, which: str) -> AsyncIterator[Store]:
    """The store the other transaction runs on: the harness's own, or (SQLite) a
    second store on the same file, whose transaction holds the file's write lock."""
    if which == "same store":
        yield harness.store
        return
    store = harness.store
    assert isinstance(store, SqliteStore)
    other = SqliteStore(store.path, synchronous="NORMAL")
    try:
        yield other
    finally:
        await other.close()


@contextlib.asynccontextmanager
async def key_held_uncommitted(store: Store, call: ToolCall) -> AsyncIterator[asyncio.Task[None]]:
    """Another task's transaction inserts ``call``'s key and holds it, uncommitted,
    for HOLD_S, then rolls back (or sooner, when the block is left)."""
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    inside, leave = asyncio.Event(), asyncio.Event()

    class RolledBack(Exception):
        pass

    async def hold() -> None:
        with contextlib.suppress(RolledBack):
            async with store.transaction() as tx:
                await ledger.begin(call, tx=tx)
                inside.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(leave.wait(), HOLD_S)
                raise RolledBack

    holder = asyncio.create_task(hold())
    try:
        await asyncio.wait_for(inside.wait(), 10)
        yield holder
    finally:
        leave.set()
        await asyncio.wait_for(holder, 10 + HOLD_S)


WRITERS = pytest.mark.parametrize("which", ["same store", "second store"])


def skip_unless_two_stores(harness: StoreHarness, which: str) -> None:
    if which == "second store" and harness.kind != "sqlite":
        pytest.skip("a second store on one file: SQLite's write lock")


async def assert_clean_afterwards(
    harness: StoreHarness, ledger: EffectLedger, call: ToolCall, ran: list[str]
) -> None:
    """Nothing was stored for the key; the next call runs the handler, once."""
    assert ran == []
    assert await harness.store.find(ledger.idem_key(call)) is None

    def later(effect: Effect) -> str:
        ran.append("later")
        return "ok"

    assert await asyncio.wait_for(ledger.run(call, later), 10) == "ok"
    assert ran == ["later"]


@WRITERS
async def test_a_plain_call_times_out_within_its_wait_on_an_uncommitted_insert(
    harness: StoreHarness, which: str
) -> None:
    skip_unless_two_stores(harness, which)
    call = ToolCall(workflow_id="wf", tool="charge", args={"writer": which})
    ledger = harness.ledger()
    ran: list[str] = []
    async with other_writer(harness, which) as store, key_held_uncommitted(store, call):
        began = time.monotonic()
        with pytest.raises(EffectTimeoutError) as info:
            await asyncio.wait_for(ledger.run(call, lambda e: ran.append("ran"), OPTIONS), 30)
        waited = time.monotonic() - began
        assert WAIT_MS / 1000 * 0.9 <= waited < WAIT_MS / 1000 + MARGIN_S, waited
        assert info.value.limit_ms == WAIT_MS
        assert info.value.idem_key == ledger.idem_key(call)
        assert info.value.status is None  # it never saw the effect
    await assert_clean_afterwards(harness, ledger, call, ran)


@WRITERS
@pytest.mark.parametrize("how", ["cancel", "wait_for"])
async def test_cancelling_a_plain_call_waiting_on_an_uncommitted_insert_is_prompt(
    harness: StoreHarness, which: str, how: str
) -> None:
    """The default wait (30 s) is far longer than the hold: only the cancellation ends it."""
    skip_unless_two_stores(harness, which)
    call = ToolCall(workflow_id="wf", tool="charge", args={"writer": which, "how": how})
    ledger = harness.ledger()
    ran: list[str] = []

    def running() -> Any:
        return ledger.run(call, lambda e: ran.append("ran"))

    async with other_writer(harness, which) as store, key_held_uncommitted(store, call) as held:
        began = time.monotonic()
        if how == "cancel":
            waiter = asyncio.create_task(running())
            await asyncio.sleep(0.2)
            assert not waiter.done()
            cancelled_at = time.monotonic()
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(waiter), 30)
            took = time.monotonic() - cancelled_at
        else:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(running(), 0.2)
            took = time.monotonic() - began - 0.2
        assert took < MARGIN_S, took
        assert not held.done(), "the other transaction is still open"
    await assert_clean_afterwards(harness, ledger, call, ran)


async def test_the_wait_counts_from_the_call_not_from_the_end_of_the_lock_wait(
    harness: StoreHarness,
) -> None:
    """The other transaction commits the key (held, processing) after most of the
    caller's wait: the caller then waits only what is left of it, not a whole wait more."""
    call = ToolCall(workflow_id="wf", tool="charge", args={"commits": True})
    ledger = harness.ledger()
    other = EffectLedger(EffectLedgerOptions(store=harness.store))
    inside = asyncio.Event()

    async def hold_then_commit() -> None:
        async with harness.store.transaction() as tx:
            await other.begin(call, tx=tx)  # processing, held by nobody who heartbeats
            inside.set()
            await asyncio.sleep(0.8 * WAIT_MS / 1000)

    holder = asyncio.create_task(hold_then_commit())
    await asyncio.wait_for(inside.wait(), 10)
    began = time.monotonic()
    with pytest.raises(EffectTimeoutError):
        await asyncio.wait_for(ledger.run(call, lambda e: "ran", OPTIONS), 30)
    waited = time.monotonic() - began
    await holder
    assert waited < WAIT_MS / 1000 + 0.3, waited


async def test_a_plain_call_times_out_within_its_wait_on_an_uncommitted_claim(
    harness: StoreHarness,
) -> None:
    """An approved effect claimed (and running) inside another transaction: the plain
    caller's duplicate count and its claims meet that transaction's row lock (the
    embedded stores: its open transaction), and it still gives up in time."""
    call = ToolCall(workflow_id="wf", tool="charge", args={"approved": True})
    ledger = harness.ledger()
    gated = RunOptions(
        requires_approval=True, concurrency=ConcurrencyOptions(approval_timeout_ms=10)
    )
    with pytest.raises(Exception, match="approval"):
        await ledger.run(call, lambda e: "never", gated)
    assert await ledger.approve(ledger.idem_key(call), by="ops")
    claimed, finish = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    async def inside(effect: object) -> str:
        ran.append("inside")
        claimed.set()
        await finish.wait()
        return "inside"

    async def in_transaction() -> object:
        async with harness.store.transaction() as tx:
            return await ledger.run(call, inside, tx=tx)

    holder = asyncio.create_task(in_transaction())
    try:
        await asyncio.wait_for(claimed.wait(), 10)
        began = time.monotonic()
        with pytest.raises(EffectTimeoutError):
            await asyncio.wait_for(ledger.run(call, lambda e: ran.append("plain"), OPTIONS), 30)
        waited = time.monotonic() - began
        assert waited < WAIT_MS / 1000 + MARGIN_S, waited
    finally:
        finish.set()
        assert await asyncio.wait_for(holder, 10) == "inside"
    assert ran == ["inside"]
