"""A cancelled store.transaction() leaves nothing behind (issue 10, item 5).

Whatever await a cancellation lands on (waiting for another transaction, the
BEGIN, a statement inside, the COMMIT), the store stays usable afterwards
and the cancelled block is either committed whole or not at all: never an
effect left half-written or a transaction left open.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, EffectStatus, RunOptions, ToolCall
from agent_ledger.stores.base import BeginOutcome, NewEffect
from agent_ledger.testing import FaultyStore
from tests.harness import StoreHarness

FIRST = ToolCall(workflow_id="wf", tool="first", args={})
SECOND = ToolCall(workflow_id="wf", tool="second", args={})
AFTER = ToolCall(workflow_id="wf", tool="after", args={})


async def assert_usable(harness: StoreHarness) -> None:
    """A plain run and a run inside a new transaction both work."""
    ledger = harness.ledger()
    assert await asyncio.wait_for(ledger.run(AFTER, lambda e: "after"), 10) == "after"
    async with asyncio.timeout(10), harness.store.transaction() as tx:
        again = ToolCall(workflow_id="wf", tool="again", args={})
        assert await ledger.run(again, lambda e: "again", tx=tx) == "again"


# Only the stores that serialize transactions: on PostgreSQL a second
# transaction does not wait for the first to begin.
@pytest.mark.parametrize("harness", ["memory", "sqlite"], indirect=True)
async def test_cancelled_while_waiting_for_another_transaction(harness: StoreHarness) -> None:
    """A transaction cancelled while it waits for the open one to end changes nothing;
    the open one commits, and the store stays usable."""
    ledger = harness.ledger()
    inside, finish = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with harness.store.transaction() as tx:
            await ledger.run(FIRST, lambda e: 1, tx=tx)
            inside.set()
            await finish.wait()

    async def second() -> None:
        async with harness.store.transaction() as tx:
            await ledger.run(SECOND, lambda e: 2, tx=tx)

    holder = asyncio.create_task(first())
    await asyncio.wait_for(inside.wait(), 10)
    waiter = asyncio.create_task(second())
    await asyncio.sleep(0.05)
    assert not waiter.done()  # it waits for the open transaction
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    finish.set()
    await asyncio.wait_for(holder, 10)
    assert await ledger.find_by_idem_key(ledger.idem_key(SECOND)) is None
    done = await ledger.find_by_idem_key(ledger.idem_key(FIRST))
    assert done is not None and done.status is EffectStatus.SUCCEEDED
    await assert_usable(harness)


@pytest.mark.parametrize("harness", ["memory", "sqlite"], indirect=True)
@pytest.mark.parametrize("how", ["cancel", "wait_for"])
async def test_a_run_waiting_behind_another_tasks_transaction_can_be_cancelled(
    harness: StoreHarness, how: str
) -> None:
    """A plain run whose begin waits for another task's open transaction has done
    nothing yet: cancelling it (or its wait_for timing out) ends it at once, not
    when that transaction ends, and leaves no effect behind; a later run works."""
    ledger = harness.ledger()
    inside, finish = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    async def holder() -> None:
        async with harness.store.transaction() as tx:
            await ledger.run(FIRST, lambda e: 1, tx=tx)
            inside.set()
            await finish.wait()

    holding = asyncio.create_task(holder())
    await asyncio.wait_for(inside.wait(), 10)
    loop = asyncio.get_running_loop()
    began = loop.time()
    if how == "cancel":
        waiter = asyncio.create_task(ledger.run(SECOND, lambda e: ran.append("second")))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # it waits for the open transaction
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(waiter), 5)
    else:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ledger.run(SECOND, lambda e: ran.append("second")), 0.05)
    assert loop.time() - began < 5  # not held until the transaction ends
    assert not holding.done()  # the transaction is still open
    finish.set()
    await asyncio.wait_for(holding, 10)
    assert ran == []
    assert await ledger.find_by_idem_key(ledger.idem_key(SECOND)) is None
    assert await asyncio.wait_for(ledger.run(SECOND, lambda e: "second"), 10) == "second"
    await assert_usable(harness)


@pytest.mark.parametrize("harness", ["memory", "sqlite"], indirect=True)
async def test_a_park_run_cancelled_while_recording_its_start_behind_a_transaction_gives_back(
    harness: StoreHarness,
) -> None:
    """Under on_stale="park" the run owns its effect before it records its handler's
    start; if that record waits behind another task's transaction and the run is
    cancelled, the record is stopped but the effect is still given back (ready, the
    handler never ran), so the next caller runs it at once instead of after a lease."""
    opened, finish = asyncio.Event(), asyncio.Event()
    holders: list[asyncio.Task[None]] = []

    async def holder() -> None:
        async with harness.store.transaction():
            opened.set()
            await finish.wait()

    class OpensATransactionAfterBegin(FaultyStore[Any]):
        async def begin(self, new: NewEffect, **kwargs: Any) -> BeginOutcome:
            outcome: BeginOutcome = await self.inner.begin(new, **kwargs)
            if not holders:
                holders.append(asyncio.create_task(holder()))
                await opened.wait()
            return outcome

    ledger = EffectLedger(EffectLedgerOptions(store=OpensATransactionAfterBegin(harness.store)))
    ran: list[str] = []
    park = RunOptions(on_stale="park")
    run = asyncio.create_task(ledger.run(SECOND, lambda e: ran.append("first"), park))
    await asyncio.wait_for(opened.wait(), 10)
    await asyncio.sleep(0.05)
    assert not run.done()  # recording the handler's start waits for the transaction
    run.cancel()
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(run), 10)
    await asyncio.wait_for(holders[0], 10)
    given_back = await ledger.find_by_idem_key(ledger.idem_key(SECOND))
    assert given_back is not None and given_back.status is EffectStatus.READY
    assert ran == []
    assert await asyncio.wait_for(ledger.run(SECOND, lambda e: "second", park), 5) == "second"


async def test_cancelled_at_every_step_of_a_transaction(harness: StoreHarness) -> None:
    """Cancel a transaction after k event-loop steps, for every k until it completes on
    its own: each time the store stays usable, and the block committed whole or not at all."""
    ledger = harness.ledger()
    for k in range(1_000):
        call = ToolCall(workflow_id="every-step", tool="t", args={"k": k})

        async def block(call: ToolCall = call) -> None:
            async with harness.store.transaction() as tx:
                await ledger.run(call, lambda e: "x", tx=tx)

        task = asyncio.create_task(block())
        for _ in range(k):
            await asyncio.sleep(0)
        completed = task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await assert_usable(harness)
        effect = await ledger.find_by_idem_key(ledger.idem_key(call))
        assert effect is None or effect.status is EffectStatus.SUCCEEDED
        if completed:
            assert effect is not None
            break
    else:
        pytest.fail("the transaction never completed within 1000 loop steps")
