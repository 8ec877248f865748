"""engine.ownership.own: a begin or claim awaited to its end through cancellations."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from agent_ledger import Effect, MemoryStore
from agent_ledger.engine.ownership import own
from agent_ledger.stores.base import BeginOutcome, NewEffect
from agent_ledger.testing import FaultyStore

NEW = NewEffect("ef" * 32, "wf", None, "t", "{}", None)


def created(begun: BeginOutcome) -> Effect | None:
    return begun.effect if begun.created else None


async def started(store: FaultyStore[MemoryStore], step: str) -> None:
    while store.calls[step] == 0:
        await asyncio.sleep(0.001)


async def test_an_uncancelled_step_returns_its_outcome() -> None:
    store = FaultyStore(MemoryStore())
    begun = await own(store, store.begin(NEW), created, name="begin")
    assert begun.created and store.calls["release"] == 0


async def test_a_step_cancelled_itself_is_given_up() -> None:
    """If the step's own task is cancelled (the loop is closing), the caller stops
    waiting for it: nothing landed, nothing to release."""
    store = FaultyStore(MemoryStore())
    store.slow("begin", seconds=30)
    caller = asyncio.create_task(own(store, store.begin(NEW), created, name="begin"))
    await started(store, "begin")
    caller.cancel()
    await asyncio.sleep(0.01)
    assert not caller.done()  # waiting for the step, through the cancellation
    (step,) = asyncio.all_tasks() - {caller, asyncio.current_task()}
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert (len(store.inner), store.calls["release"]) == (0, 0)


async def test_a_step_that_fails_after_the_cancel_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The step's error cannot reach a cancelled caller: it is logged, and the
    cancellation propagates."""
    store = FaultyStore(MemoryStore())
    store.slow("begin", seconds=0.05)
    store.fail("begin")
    caller = asyncio.create_task(own(store, store.begin(NEW), created, name="begin"))
    await started(store, "begin")
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert store.calls["release"] == 0
    assert any(
        r.levelno == logging.WARNING
        and "begin failed while the run was being cancelled" in r.getMessage()
        for r in caplog.records
    )


# -- Python 3.11: the step started by hand (no eager tasks there) ---------------------


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ starts the task eagerly")
async def test_a_step_that_never_waits_runs_without_a_task() -> None:
    """MemoryStore's begin never waits: it must cost no task and no loop turn."""
    ran_in: list[asyncio.Task[object] | None] = []

    async def step() -> BeginOutcome:
        ran_in.append(asyncio.current_task())
        return await MemoryStore().begin(NEW)

    begun = await own(MemoryStore(), step(), created, name="begin")
    assert begun.created and ran_in == [asyncio.current_task()]


async def test_a_step_that_waits_gets_every_value_and_error_relayed() -> None:
    """A step suspended on futures, a bare yield and a sleep is carried on in a task:
    each result and each exception reaches it where it waits, as `await` would."""
    loop = asyncio.get_running_loop()
    first: asyncio.Future[int] = loop.create_future()
    second: asyncio.Future[int] = loop.create_future()
    seen: list[object] = []

    async def step() -> BeginOutcome:
        seen.append(await first)
        await asyncio.sleep(0)  # a bare yield
        try:
            await second
        except LookupError as exc:
            seen.append(type(exc).__name__)
        await asyncio.sleep(0.001)
        return await MemoryStore().begin(NEW)

    caller = asyncio.create_task(own(MemoryStore(), step(), created, name="begin"))
    await asyncio.sleep(0)
    loop.call_soon(first.set_result, 7)
    loop.call_later(0.01, second.set_exception, LookupError("gone"))
    begun = await caller
    assert begun.created and seen == [7, "LookupError"]


async def test_cancelling_the_steps_task_reaches_the_step() -> None:
    """When the loop closes it cancels the step's task: the cancellation must be
    thrown into the step itself (its cleanup runs), not swallowed on the way."""
    store = FaultyStore(MemoryStore())
    cleaned: list[str] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def step() -> BeginOutcome:
        try:
            await gate
        except asyncio.CancelledError:
            cleaned.append("cancelled")
            raise
        return await store.begin(NEW)

    caller = asyncio.create_task(own(store, step(), created, name="begin"))
    await asyncio.sleep(0.01)
    (step_task,) = asyncio.all_tasks() - {caller, asyncio.current_task()}
    step_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cleaned == ["cancelled"] and len(store.inner) == 0
