"""engine.ownership.own: a begin or claim awaited to its end through cancellations."""

from __future__ import annotations

import asyncio
import logging

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
