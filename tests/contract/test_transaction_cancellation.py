"""A cancelled store.transaction() leaves nothing behind (issue 10, item 5).

Whatever await a cancellation lands on (waiting for another transaction, the
BEGIN, a statement inside, the COMMIT), the store stays usable afterwards
and the cancelled block is either committed whole or not at all: never an
effect left half-written or a transaction left open.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agent_ledger import EffectStatus, ToolCall
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
