"""engine.ownership.start and finish, own's two halves: a step runs in the caller's
task up to its first wait, tracked for the store; one that waits is carried on."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import Effect, MemoryStore
from agent_ledger.context import StepProgress, step_progress
from agent_ledger.engine.ownership import Pending, finish, start
from agent_ledger.stores.base import BeginOutcome, NewEffect
from agent_ledger.testing import FaultyStore

NEW = NewEffect("ab" * 32, "wf", None, "t", "{}", None)


def created(begun: BeginOutcome) -> Effect | None:
    return begun.effect if begun.created else None


async def test_a_step_that_never_waits_is_answered_by_start_itself() -> None:
    store = MemoryStore()
    tasks = len(asyncio.all_tasks())
    begun = start(store.begin(NEW))
    assert isinstance(begun, BeginOutcome) and begun.created
    assert len(asyncio.all_tasks()) == tasks  # no task was started for it


async def test_the_step_sees_its_progress_tracked_only_while_it_starts() -> None:
    seen: list[StepProgress | None] = []

    async def step() -> str:
        seen.append(step_progress())
        await asyncio.sleep(0)
        seen.append(step_progress())
        return "done"

    pending = start(step())
    assert isinstance(pending, Pending)
    assert step_progress() is None  # reset in the caller once the step waits
    assert await finish(MemoryStore(), pending, lambda _: None, name="step") == "done"
    assert isinstance(seen[0], StepProgress) and seen[0] is pending.progress


async def test_a_cancelled_caller_of_a_waiting_begin_gives_the_effect_back() -> None:
    store = FaultyStore(MemoryStore())
    store.slow("begin", seconds=0.05)
    pending = start(store.begin(NEW))
    assert isinstance(pending, Pending)
    caller = asyncio.create_task(finish(store, pending, created, name="begin"))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert store.calls["release"] == 1
    effect = await store.find(NEW.idem_key)
    assert effect is not None and effect.status.value == "ready"
