"""Heartbeats go out as one batch per tick, for every running handler of a ledger."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent_ledger import Effect, EffectStatus, RunOptions, ToolCall
from agent_ledger.engine.heartbeats import Heartbeats
from agent_ledger.options import StaleOptions
from agent_ledger.testing import FaultyStore, build_ledger
from tests.harness import StoreHarness

AFTER_MS = 300  # a beat every 100 ms


async def test_many_running_handlers_share_one_heartbeat_call_per_tick(
    harness: StoreHarness,
) -> None:
    """Eight handlers alive for about six ticks cost about six heartbeat calls, not 48."""
    store = FaultyStore(harness.store)
    ledger = build_ledger(store, defaults=RunOptions(stale=StaleOptions(after_ms=AFTER_MS)))
    release = asyncio.Event()
    started = 0

    async def long_job(effect: Effect) -> int:
        nonlocal started
        started += 1
        await release.wait()
        return effect.attempt

    calls = [ToolCall(workflow_id="wf", tool="long", args={"n": n}) for n in range(8)]
    runs = [asyncio.create_task(ledger.run(call, long_job)) for call in calls]
    while started < len(calls):
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.65)
    release.set()
    assert await asyncio.gather(*runs) == [1] * len(calls)
    assert 3 <= store.calls["heartbeat"] <= 10, store.calls


async def test_confirmed_at_follows_the_stores_answers(
    harness: StoreHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """A refreshed beat moves confirmed_at; a lost one is stopped with a warning."""
    ledger = harness.ledger()
    begun = await ledger.begin(ToolCall(workflow_id="wf", tool="manual", args={}))
    heartbeats = Heartbeats(harness.store)
    beat = heartbeats.start(begun.effect, AFTER_MS)
    started = beat.confirmed_at
    await asyncio.sleep(0.25)
    assert beat.confirmed_at > started
    assert await ledger.cancel(begun.effect.idem_key)
    with caplog.at_level(logging.WARNING, logger="agent_ledger"):
        await asyncio.sleep(0.25)
    confirmed = beat.confirmed_at
    assert "lost the effect while its handler runs" in caplog.text
    await asyncio.sleep(0.15)
    assert beat.confirmed_at == confirmed  # stopped: no more beats for it
    effect = await ledger.get_effect(begun.effect.id)
    assert effect is not None and effect.status is EffectStatus.CANCELED
    beat.stop()
