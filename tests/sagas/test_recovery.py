"""recover_sagas() on every store: sagas whose owner died are finished from the
stored steps and the tool registry (in-process: the owner "dies" by stopping its
heartbeat; the SIGKILL versions are in test_saga_crashes.py)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agent_ledger import Effect, EffectDeniedError, EffectStatus, RunOptions
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.sagas import Saga, SagaFailed, SagaStatus
from agent_ledger.sagas._compensation import compensation_call
from agent_ledger.sagas._saga import saga_store
from agent_ledger.stores.saga_base import NewSaga, NewSagaStep, SagaStore
from tests.harness import StoreHarness
from tests.sagas.conftest import Shop, shop_of

G = SagaStatus
LEASE = 1_000


async def _die(saga: Saga) -> None:
    """The owner stops: no more heartbeats, nothing undone (as after a SIGKILL)."""
    assert saga._heartbeat is not None
    saga._heartbeat.stop()


async def _dead_while_compensating(harness: StoreHarness) -> tuple[Shop, SagaStore]:
    """s1 and s2 succeeded, s3 failed, the owner marked the saga compensating and died."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2", "s3")
    shop.failing.add("s3")
    saga = ledger.saga("order-42", lease_ms=LEASE)
    await saga.__aenter__()
    await shop["s1"]("a")
    await shop["s2"]("b")
    with pytest.raises(Exception, match="s3 declined"):
        await shop["s3"]("c")
    store = saga_store(ledger)
    assert await store.finish_saga(
        "order-42", attempt=1, expect=G.RUNNING, then=G.COMPENSATING, error=None
    )
    await _die(saga)
    await harness.age(LEASE * 2)
    return shop, store


def _recoverer(harness: StoreHarness, shop: Shop) -> Shop:
    """Another worker's ledger, with the same tools, logging into the same list."""
    other = shop_of(harness.ledger(), "s1", "s2", "s3")
    other.log = shop.log
    other.failing = shop.failing
    return other


async def test_recover_finishes_a_compensating_saga_once_even_with_two_recoverers(
    harness: StoreHarness,
) -> None:
    shop, store = await _dead_while_compensating(harness)
    recoverers = [_recoverer(harness, shop) for _ in range(2)]
    reports = await asyncio.gather(*(r.ledger.recover_sagas() for r in recoverers))
    finished = [o for report in reports for o in report.finished]
    assert [o.status for o in finished] == [G.COMPENSATED]
    assert shop.log == ["s1", "s2", "s3", "undo s2", "undo s1"]
    saga = await store.get_saga("order-42")
    assert saga is not None and saga.status is G.COMPENSATED and saga.attempt == 2
    again = await recoverers[0].ledger.recover_sagas()
    assert again.finished == [] and again.running == []


async def test_re_running_the_code_finishes_the_undo_instead(harness: StoreHarness) -> None:
    shop, _ = await _dead_while_compensating(harness)
    other = _recoverer(harness, shop)
    with pytest.raises(SagaFailed) as failed:
        async with other.ledger.saga("order-42"):
            pytest.fail("a saga being undone does not run its code again")
    assert failed.value.status is G.COMPENSATED
    assert shop.log == ["s1", "s2", "s3", "undo s2", "undo s1"]


async def test_a_running_saga_is_listed_or_after_abandon_after_rolled_back(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    kept = ledger.saga("kept", lease_ms=LEASE)
    await kept.__aenter__()
    await shop["s1"]("a")
    await _die(kept)
    left = ledger.saga("left", lease_ms=LEASE, abandon_after=timedelta(seconds=60))
    await left.__aenter__()
    await shop["s2"]("b")
    await _die(left)
    await harness.age(LEASE * 2)
    report = await ledger.recover_sagas()
    assert sorted(s.saga_id for s in report.running) == ["kept", "left"], "not abandoned yet"
    assert report.finished == [] and shop.log == ["s1", "s2"]
    await harness.age(61_000)
    report = await ledger.recover_sagas()
    assert report.abandoned == ["left"] and [s.saga_id for s in report.running] == ["kept"]
    [outcome] = report.finished
    assert outcome.status is G.COMPENSATED
    assert outcome.error is not None and outcome.error.code == "abandoned"
    assert shop.log == ["s1", "s2", "undo s2"]
    store = saga_store(ledger)
    kept_row = await store.get_saga("kept")
    assert kept_row is not None and kept_row.status is G.RUNNING


async def test_a_step_recorded_but_never_begun_is_closed_for_good(harness: StoreHarness) -> None:
    """The owner died between recording step 2 and beginning its effect: the
    recoverer closes the key, so the old owner, waking up, cannot run it."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    saga = ledger.saga("gap", lease_ms=LEASE, abandon_after=timedelta(0))
    await saga.__aenter__()
    await shop["s1"]("a")
    call = shop["s2"].tool_call("b")
    await saga._record(1, 1, shop["s2"], ledger.idem_key(call), None)
    await _die(saga)
    await harness.age(LEASE * 2)
    report = await ledger.recover_sagas()
    [outcome] = report.finished
    assert outcome.status is G.COMPENSATED
    assert outcome.steps[1].forward_status is EffectStatus.CANCELED
    with pytest.raises(EffectDeniedError):
        await ledger.run(call, lambda e: shop.log.append("zombie s2"))
    assert shop.log == ["s1", "undo s1"]


async def test_a_missing_compensation_tool_is_reported_and_the_saga_left_for_later(
    harness: StoreHarness,
) -> None:
    shop, store = await _dead_while_compensating(harness)
    bare = harness.ledger()  # knows none of the tools
    report = await bare.recover_sagas()
    assert [saga_id for saga_id, _ in report.errors] == ["order-42"]
    assert "not registered" in report.errors[0][1]
    saga = await store.get_saga("order-42")
    assert saga is not None and saga.status is G.COMPENSATING
    assert saga.attempt == 1, "not claimed: a pass with the tools need not wait"
    assert shop.log == ["s1", "s2", "s3"], "nothing was undone"
    report = await _recoverer(harness, shop).ledger.recover_sagas()
    assert [o.status for o in report.finished] == [G.COMPENSATED]


async def test_a_dead_saga_behind_more_than_limit_newer_running_ones_is_finished(
    harness: StoreHarness,
) -> None:
    """recover_sagas used to read the `limit` newest open sagas and filter them:
    a dead compensating saga behind that many running ones was never reached."""
    shop, store = await _dead_while_compensating(harness)
    for i in range(4):  # newer, running, live owners (and one kept for a person)
        await store.begin_saga(NewSaga(f"busy-{i}", "w2", 600_000, None, "continue"))
    report = await _recoverer(harness, shop).ledger.recover_sagas(limit=2)
    assert [o.saga_id for o in report.finished] == ["order-42"]
    assert [o.status for o in report.finished] == [G.COMPENSATED]
    assert len(report.running) == 2, "running sagas are listed up to the limit"
    assert shop.log == ["s1", "s2", "s3", "undo s2", "undo s1"]


async def test_sagas_this_pass_cannot_finish_do_not_use_up_its_limit(
    harness: StoreHarness,
) -> None:
    """Older sagas whose compensation tool is missing here are reported and
    skipped; the pass goes on to the ones it can finish."""
    store = saga_store(harness.ledger())
    for i in range(3):
        name = f"unknown-{i}"
        await store.begin_saga(NewSaga(name, "w", LEASE, None, "continue"))
        step = NewSagaStep(0, 0, "elsewhere", f"k{i}", "elsewhere.undo", f"u{i}", "succeeded")
        assert await store.record_step(name, attempt=1, step=step) is not None
        assert await store.finish_saga(
            name, attempt=1, expect=G.RUNNING, then=G.COMPENSATING, error=None
        )
        await harness.age(10)
    shop, _ = await _dead_while_compensating(harness)
    report = await _recoverer(harness, shop).ledger.recover_sagas(limit=1)
    assert [saga_id for saga_id, _ in report.errors] == ["unknown-0", "unknown-1", "unknown-2"]
    assert [o.saga_id for o in report.finished] == ["order-42"]


async def test_a_wait_that_runs_out_leaves_the_saga_compensating_for_a_later_pass(
    harness: StoreHarness,
) -> None:
    # The dead owner had begun s2's refund, with a lease longer than the
    # recoverer is willing to wait: the pass gives up waiting, which changes
    # nothing (issue 26, item 2); a later pass, once that lease has run out,
    # takes the refund over and runs it once.
    shop, store = await _dead_while_compensating(harness)
    step = next(s for s in await store.saga_steps("order-42") if s.tool == "s2")
    forward = await store_effect(harness, step.idem_key)
    call = compensation_call(forward.workflow_id, "undo.s2", forward.idem_key)
    ledger = harness.ledger()
    # The owner died inside it: begun with its 60 s lease, never committed.
    begun = await ledger.begin(call, run_options=RunOptions(stale=StaleOptions(after_ms=60_000)))
    refund = begun.effect
    impatient = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=200))
    recoverer = shop_of(harness.ledger(defaults=impatient), "s1", "s2", "s3")
    recoverer.log = shop.log
    first = await recoverer.ledger.recover_sagas(lease_ms=LEASE)
    assert first.finished == []
    assert [saga_id for saga_id, _ in first.errors] == ["order-42"]
    assert "EffectTimeoutError" in first.errors[0][1]
    saga = await store.get_saga("order-42")
    assert saga is not None and saga.status is G.COMPENSATING
    await harness.age(61_000)
    later = await recoverer.ledger.recover_sagas(lease_ms=LEASE)
    assert [o.status for o in later.finished] == [G.COMPENSATED]
    assert shop.log == ["s1", "s2", "s3", "undo s2", "undo s1"]
    undone = await harness.store.find(refund.idem_key)
    assert undone is not None and undone.status is EffectStatus.SUCCEEDED


async def store_effect(harness: StoreHarness, idem_key: str) -> Effect:
    found = await harness.store.find(idem_key)
    assert found is not None
    return found
