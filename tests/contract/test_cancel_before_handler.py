"""A run cancelled while its begin or claim is in flight gives the effect back.

The store step is slowed on purpose (``FaultyStore.slow``), so the cancellation
lands while it is under way; the step still lands, as a real one may (SQLite's
thread finishes it, PostgreSQL may run it before the cancel request arrives).
The run then waits for it, releases what it made its own, and re-raises: the
effect is ``ready``, and the next run claims it at once (with a lease that has
not run out, and a wait timeout far shorter than it) and runs the handler once.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent_ledger import Effect, EffectLedger, EffectStatus, RunOptions, ToolCall
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.stores.base import Store
from agent_ledger.testing import FaultyStore, build_ledger
from tests.approvals import make_pending
from tests.harness import StoreHarness

S = EffectStatus
CALL = ToolCall(workflow_id="wf", tool="charge", args={"cents": 500})
#: A lease far longer than anyone waits here: only a release lets the next run in.
OPTIONS = RunOptions(
    stale=StaleOptions(after_ms=60_000),
    concurrency=ConcurrencyOptions(
        wait_timeout_ms=2_000, approval_timeout_ms=2_000, initial_interval_ms=5
    ),
)
SLOW_S = 0.2


class Charges:
    """A handler that counts its executions."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, effect: Effect) -> str:
        self.count += 1
        return f"ch_{effect.attempt}"


def slowed(harness: StoreHarness) -> tuple[FaultyStore[Store], EffectLedger]:
    store = FaultyStore(harness.store)
    return store, build_ledger(store, defaults=OPTIONS)


async def cancel_during(store: FaultyStore[Store], step: str, run: asyncio.Task[object]) -> None:
    """Cancel ``run`` once ``step`` has started (it is slow: still under way), then await it."""
    started = store.calls[step]
    while store.calls[step] == started:
        await asyncio.sleep(0.001)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def next_run_claims_at_once(ledger: EffectLedger, store: FaultyStore[Store]) -> Effect:
    charges = Charges()
    store.slow("begin", "claim", seconds=0)
    result = await ledger.run(CALL, charges)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is S.SUCCEEDED
    assert result == f"ch_{effect.attempt}" and charges.count == 1
    return effect


async def test_cancelled_while_its_insert_is_in_flight(harness: StoreHarness) -> None:
    """The insert lands after the cancel: the effect is released (ready, no
    execution), and the next run claims it at once and runs the handler once."""
    store, ledger = slowed(harness)
    charges = Charges()
    store.slow("begin", seconds=SLOW_S)
    await cancel_during(store, "begin", asyncio.create_task(ledger.run(CALL, charges)))
    assert charges.count == 0
    released = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert released is not None
    assert (released.status, released.attempt, released.executions) == (S.READY, 1, 0)
    assert released.started_at is None
    done = await next_run_claims_at_once(ledger, store)
    assert (done.attempt, done.executions, done.dedup_count) == (2, 1, 1)
    assert store.calls["release"] == 1


async def test_a_second_cancellation_keeps_waiting_for_the_insert(harness: StoreHarness) -> None:
    """Cancelled again while it waits for the step, the run still gives the effect back."""
    store, ledger = slowed(harness)
    store.slow("begin", seconds=SLOW_S)
    run = asyncio.create_task(ledger.run(CALL, Charges()))
    while store.calls["begin"] == 0:
        await asyncio.sleep(0.001)
    run.cancel()
    await asyncio.sleep(SLOW_S / 4)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    released = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert released is not None and released.status is S.READY
    await next_run_claims_at_once(ledger, store)


async def test_cancelled_while_claiming_an_approved_effect(harness: StoreHarness) -> None:
    """The approved claim lands after the cancel: the effect is ready again (the
    approval stands), and the next run claims it at once."""
    store, ledger = slowed(harness)
    pending = await make_pending(ledger, CALL)
    assert await ledger.approve(pending.idem_key, by="ops")
    charges = Charges()
    store.slow("claim", seconds=SLOW_S)
    await cancel_during(store, "claim", asyncio.create_task(ledger.run(CALL, charges)))
    assert charges.count == 0
    released = await ledger.find_by_idem_key(pending.idem_key)
    assert released is not None
    assert (released.status, released.attempt, released.executions) == (S.READY, 2, 0)
    assert released.started_at is None and released.decided_by == "ops"
    done = await next_run_claims_at_once(ledger, store)
    assert (done.attempt, done.executions) == (3, 1)


async def test_cancelled_while_taking_over_a_stale_effect(harness: StoreHarness) -> None:
    """A takeover released before its handler started keeps the first execution only."""
    store, ledger = slowed(harness)
    crashed = await ledger.begin(CALL)  # a worker that begins, then dies
    await harness.age(OPTIONS.stale.after_ms + 1)  # type: ignore[union-attr, operator]
    charges = Charges()
    store.slow("claim", seconds=SLOW_S)
    await cancel_during(store, "claim", asyncio.create_task(ledger.run(CALL, charges)))
    assert charges.count == 0
    released = await ledger.get_effect(crashed.effect.id)
    assert released is not None
    assert (released.status, released.attempt, released.executions) == (S.READY, 2, 1)
    done = await next_run_claims_at_once(ledger, store)
    assert (done.attempt, done.executions) == (3, 2)


async def test_an_effect_created_for_approval_needs_no_release(harness: StoreHarness) -> None:
    """Inserted as requires_approval, nobody owns it: nothing to give back."""
    store, ledger = slowed(harness)
    store.slow("begin", seconds=SLOW_S)
    run = asyncio.create_task(ledger.run(CALL, Charges(), RunOptions(requires_approval=True)))
    await cancel_during(store, "begin", run)
    pending = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert pending is not None and pending.status is S.REQUIRES_APPROVAL
    assert store.calls["release"] == 0


async def test_a_replay_cancelled_mid_begin_changes_nothing(harness: StoreHarness) -> None:
    """The begin found a finished effect: nothing was ours, nothing is released."""
    store, ledger = slowed(harness)
    charges = Charges()
    assert await ledger.run(CALL, charges) == "ch_1"
    store.slow("begin", seconds=SLOW_S)
    await cancel_during(store, "begin", asyncio.create_task(ledger.run(CALL, charges)))
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.status, effect.executions) == (S.SUCCEEDED, 1)
    assert (charges.count, store.calls["release"]) == (1, 0)


async def test_a_failed_release_is_logged_and_the_cancellation_still_propagates(
    harness: StoreHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """If the release itself fails, the effect is left to its lease, as after a crash."""
    store, ledger = slowed(harness)
    store.slow("begin", seconds=SLOW_S)
    store.fail("release")
    await cancel_during(store, "begin", asyncio.create_task(ledger.run(CALL, Charges())))
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is S.PROCESSING
    assert any(
        r.levelno == logging.ERROR and "could not give back" in r.getMessage()
        for r in caplog.records
    )


async def test_a_waiter_beside_the_cancelled_claim_runs_the_effect(harness: StoreHarness) -> None:
    """Another caller waiting on the same key (sharing the cancelled run's poll)
    claims the released effect and runs it once; the cancelled run ran nothing."""
    store, ledger = slowed(harness)
    pending = await make_pending(ledger, CALL)
    charges = Charges()
    first = asyncio.create_task(ledger.run(CALL, charges))
    await asyncio.sleep(0.05)  # first waits for the approval
    store.slow("claim", seconds=SLOW_S)
    assert await ledger.approve(pending.idem_key)
    while store.calls["claim"] == 0:
        await asyncio.sleep(0.001)
    second = asyncio.create_task(ledger.run(CALL, charges))
    await asyncio.sleep(SLOW_S / 4)  # second is waiting too, beside the claim in flight
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second == "ch_3"
    effect = await ledger.find_by_idem_key(pending.idem_key)
    assert effect is not None and (effect.attempt, effect.executions) == (3, 1)
    assert charges.count == 1
