"""carry_through: work runs to its end through any number of cancellations of its
caller, which then get the cancellation; the work's own error wins over it."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger.engine.cancellation import carry_through, until_done


async def test_the_work_ends_and_then_the_callers_cancellation_is_raised() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    done: list[str] = []

    async def work() -> str:
        started.set()
        await release.wait()
        done.append("finished")
        return "result"

    caller = asyncio.create_task(carry_through(work()))
    await started.wait()
    caller.cancel()
    await asyncio.sleep(0)
    caller.cancel()  # a second cancellation does not cut it short either
    await asyncio.sleep(0)
    assert not caller.done() and done == []
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert done == ["finished"]


async def test_without_a_cancellation_the_result_comes_back() -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 42

    assert await carry_through(work()) == 42


async def test_the_works_own_error_wins_over_the_cancellation() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        await release.wait()
        raise LookupError("the work failed")

    caller = asyncio.create_task(carry_through(work()))
    await started.wait()
    caller.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(LookupError, match="the work failed"):
        await caller


async def test_until_done_hands_back_the_cancellation_that_came_meanwhile() -> None:
    release = asyncio.Event()
    task = asyncio.ensure_future(release.wait())
    quiet = asyncio.create_task(until_done(task))
    interrupted = asyncio.create_task(until_done(task))
    await asyncio.sleep(0)
    interrupted.cancel()
    await asyncio.sleep(0)
    assert not interrupted.done()  # still waiting for the task
    release.set()
    # Neither raises: the caller reads the outcome, then raises what it got.
    assert await quiet is None
    assert isinstance(await interrupted, asyncio.CancelledError)


async def test_a_cancelled_task_ends_the_wait() -> None:
    task = asyncio.ensure_future(asyncio.sleep(3600))
    waiting = asyncio.create_task(until_done(task))
    await asyncio.sleep(0)
    task.cancel()  # the loop closing, say: nothing left to wait for
    assert await asyncio.wait_for(waiting, 1) is None
    assert task.cancelled()
