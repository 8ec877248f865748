"""Liveness: stale effects are taken over, live ones never are, late commits are fenced."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agent_ledger import Effect, EffectFailedError, EffectStatus, RunOptions, ToolCall
from agent_ledger.effects import CommitSucceeded
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="deploy", args={"v": 1})
STALE_MS = 5_000
OPTIONS = RunOptions(
    stale=StaleOptions(after_ms=STALE_MS),
    concurrency=ConcurrencyOptions(wait_timeout_ms=300, initial_interval_ms=5, max_interval_ms=20),
)


async def test_stale_effect_is_taken_over_with_a_new_attempt(harness: StoreHarness) -> None:
    """A processing effect silent for after_ms is claimed by the next caller, attempt 2."""
    ledger = harness.ledger(OPTIONS)
    crashed = await ledger.begin(CALL)  # a worker that begins, then dies
    await harness.age(STALE_MS + 1)
    seen: list[int] = []

    def recover(effect: Effect) -> str:
        seen.append(effect.attempt)
        return "recovered"

    assert await ledger.run(CALL, recover) == "recovered"
    assert seen == [2]
    effect = await ledger.get_effect(crashed.effect.id)
    assert effect is not None and (effect.status, effect.attempt) == (EffectStatus.SUCCEEDED, 2)


async def test_fresh_effect_is_not_taken_over(harness: StoreHarness) -> None:
    """Before after_ms has passed, a duplicate waits instead of claiming."""
    ledger = harness.ledger(OPTIONS)
    await ledger.begin(CALL)
    await harness.age(STALE_MS // 2)
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, lambda e: "stolen")


async def test_after_ms_zero_disables_takeover(harness: StoreHarness) -> None:
    """With takeover disabled, even a very old effect is only waited on."""
    options = RunOptions(
        stale=StaleOptions(after_ms=0),
        concurrency=ConcurrencyOptions(wait_timeout_ms=100, initial_interval_ms=5),
    )
    ledger = harness.ledger(options)
    await ledger.begin(CALL)
    await harness.age(10 * 60 * 60 * 1000)
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, lambda e: "stolen")


async def test_duplicates_do_not_refresh_liveness(harness: StoreHarness) -> None:
    """A duplicate begin on a dying effect must not keep it looking alive."""
    ledger = harness.ledger(OPTIONS)
    await ledger.begin(CALL)
    # A second of real time to spare: the stores with a real clock (PostgreSQL,
    # MySQL) age on their own while the duplicates run, seconds on a busy host.
    await harness.age(STALE_MS - 1_000)
    quick = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=0))
    for _ in range(3):
        with pytest.raises(EffectTimeoutError):
            await ledger.begin(CALL, run_options=quick)
    # Stale counted from the owner's last sign of life; a duplicate that had
    # refreshed it would leave the effect 1.1 s old, far from stale.
    await harness.age(1_100)
    assert await ledger.run(CALL, lambda e: e.attempt) == 2


async def test_heartbeats_keep_a_long_handler_alive(harness: StoreHarness) -> None:
    """While run() executes, heartbeats every after_ms/3 stop any takeover."""
    after_ms = 300
    options = RunOptions(
        stale=StaleOptions(after_ms=after_ms),
        concurrency=ConcurrencyOptions(wait_timeout_ms=0),
    )
    ledger = harness.ledger(options)
    release = asyncio.Event()
    executions = 0

    async def long_job(effect: Effect) -> str:
        nonlocal executions
        executions += 1
        await release.wait()
        return "done"

    owner = asyncio.create_task(ledger.run(CALL, long_job))
    await asyncio.sleep(0.02)
    for _ in range(6):  # 6 x 200 ms of store time: 4x the stale window in total
        await harness.age(200)
        await asyncio.sleep(after_ms / 3000 + 0.08)  # let a heartbeat land
        with pytest.raises(EffectTimeoutError):
            await ledger.run(CALL, long_job)
    release.set()
    assert await owner == "done"
    assert executions == 1


async def test_late_commit_from_an_older_attempt_is_fenced(harness: StoreHarness) -> None:
    """After a takeover, the original worker's commit is rejected; the winner's stands."""
    ledger = harness.ledger(OPTIONS)
    old = await ledger.begin(CALL)
    await harness.age(STALE_MS + 1)
    new = await ledger.begin(CALL)
    assert (new.effect.attempt, new.idempotency_status) == (2, "replayed")
    assert not await ledger.heartbeat(old.effect.id, old.effect.attempt)
    assert not await ledger.commit(old.effect.id, CommitSucceeded(result="old"), attempt=1)
    assert await ledger.commit(new.effect.id, CommitSucceeded(result="new"), attempt=2)
    effect = await ledger.get_effect(new.effect.id)
    assert effect is not None and effect.result == "new"


async def test_run_that_loses_its_commit_returns_the_winners_result(harness: StoreHarness) -> None:
    """A slow run() overtaken by a takeover returns what the taker recorded."""
    ledger = harness.ledger(RunOptions(stale=StaleOptions(after_ms=STALE_MS)))
    release = asyncio.Event()
    slow_ran = asyncio.Event()

    async def slow(effect: Effect) -> str:
        slow_ran.set()
        await release.wait()
        return "from the slow worker"

    # The heartbeat interval (after_ms/3 of real time) is longer than this test,
    # so the slow worker looks dead once the store clock moves past the window.
    slow_task = asyncio.create_task(ledger.run(CALL, slow))
    await slow_ran.wait()
    await harness.age(STALE_MS + 1)
    assert await ledger.run(CALL, lambda e: "from the taker") == "from the taker"
    release.set()
    assert await slow_task == "from the taker"
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.result, effect.attempt) == ("from the taker", 2)


async def test_concurrent_takeovers_have_one_winner(harness: StoreHarness) -> None:
    """Many callers find the same stale effect; exactly one re-executes."""
    ledger = harness.ledger(OPTIONS)
    await ledger.begin(CALL)
    await harness.age(STALE_MS + 1)
    executions = 0

    async def job(effect: Effect) -> int:
        nonlocal executions
        executions += 1
        await asyncio.sleep(0.05)
        return effect.attempt

    slow_wait = RunOptions(
        concurrency=ConcurrencyOptions(wait_timeout_ms=5_000, initial_interval_ms=5)
    )
    results = await asyncio.gather(*(ledger.run(CALL, job, slow_wait) for _ in range(20)))
    assert executions == 1
    assert set(results) == {2}


async def _take_over(harness: StoreHarness, times: int) -> None:
    """Claim the effect ``times`` times from holders that died without a word."""
    key = harness.ledger().idem_key(CALL)
    for _ in range(times):
        await harness.age(STALE_MS + 1)
        assert (await harness.store.claim(key, stale_after_ms=STALE_MS)).claimed


@pytest.mark.parametrize("limit", [0, 2])
async def test_takeovers_past_the_bound_fail_the_effect_instead_of_running_it(
    harness: StoreHarness, limit: int
) -> None:
    """A handler that keeps outliving its lease is not re-run for ever (issue 10, item 16)."""
    options = RunOptions(
        stale=StaleOptions(after_ms=STALE_MS, max_takeovers=limit),
        concurrency=ConcurrencyOptions(wait_timeout_ms=300, initial_interval_ms=5),
    )
    ledger = harness.ledger(options)
    await ledger.begin(CALL)
    await _take_over(harness, limit)
    await harness.age(STALE_MS + 1)
    ran: list[int] = []
    with pytest.raises(EffectFailedError, match="taken over") as info:
        await ledger.run(CALL, lambda e: ran.append(e.attempt))
    assert info.value.code == "too_many_takeovers" and ran == []
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.FAILED
    # The refused claim started no handler: executions counts the begin's and
    # the takeovers' starts only (issue 26, item 3), the attempt every claim.
    assert effect.executions == 1 + limit and effect.attempt == 2 + limit
    with pytest.raises(EffectFailedError):  # a receipt now: nobody runs it again
        await ledger.run(CALL, lambda e: ran.append(e.attempt))
    assert ran == []


async def test_takeovers_within_the_bound_still_run(harness: StoreHarness) -> None:
    options = RunOptions(
        stale=StaleOptions(after_ms=STALE_MS, max_takeovers=3),
        concurrency=ConcurrencyOptions(wait_timeout_ms=300, initial_interval_ms=5),
    )
    ledger = harness.ledger(options)
    await ledger.begin(CALL)
    await _take_over(harness, 2)
    await harness.age(STALE_MS + 1)
    assert await ledger.run(CALL, lambda e: e.attempt) == 4  # the third takeover


def _window(after_ms: int) -> RunOptions:
    return RunOptions(
        stale=StaleOptions(after_ms=after_ms),
        concurrency=ConcurrencyOptions(
            wait_timeout_ms=300, initial_interval_ms=5, max_interval_ms=20
        ),
    )


async def test_a_shorter_window_never_shortens_the_holders_lease(harness: StoreHarness) -> None:
    """The holder's lease is recorded with the effect: a caller with a smaller
    after_ms waits it out instead of taking over a worker that asked for longer."""
    ledger = harness.ledger()
    held = await ledger.begin(CALL, run_options=_window(STALE_MS))
    assert held.effect.lease_ms == STALE_MS
    await harness.age(STALE_MS // 2)
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, lambda e: "stolen", _window(1_000))
    await harness.age(STALE_MS // 2 + 1)
    assert await ledger.run(CALL, lambda e: e.attempt, _window(1_000)) == 2
    taken = await ledger.get_effect(held.effect.id)
    assert taken is not None
    # The taker's own lease is what others now judge it by.
    assert (taken.lease_ms, taken.executions) == (1_000, 2)


async def test_a_longer_window_waits_longer_than_the_lease(harness: StoreHarness) -> None:
    """Staleness needs the longer of the two: a patient caller is never hurried."""
    ledger = harness.ledger()
    await ledger.begin(CALL, run_options=_window(1_000))
    await harness.age(2_000)
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, lambda e: "early", _window(STALE_MS))
    await harness.age(STALE_MS)
    assert await ledger.run(CALL, lambda e: "late", _window(STALE_MS)) == "late"


async def test_a_holder_that_turned_takeover_off_is_never_taken_over(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    held = await ledger.begin(CALL, run_options=_window(0))
    assert held.effect.lease_ms == 0
    await harness.age(10 * 60 * 60 * 1000)
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, lambda e: "stolen", _window(1_000))


async def test_executions_count_handler_runs_not_attempts(harness: StoreHarness) -> None:
    """A fresh run is one execution; a takeover adds one; the attempt (the
    fencing token) moves with every claim."""
    ledger = harness.ledger(OPTIONS)
    fresh = await ledger.begin(CALL)
    assert (fresh.effect.executions, fresh.effect.attempt) == (1, 1)
    started = fresh.effect.started_at
    assert started is not None
    # The insert started it (PostgreSQL reads its clock per column: a few µs apart).
    assert timedelta(0) <= started - fresh.effect.created_at < timedelta(milliseconds=50)
    await harness.age(STALE_MS + 1)
    taken = await ledger.begin(CALL)
    assert (taken.effect.executions, taken.effect.attempt) == (2, 2)
    assert taken.effect.started_at is not None
    assert taken.effect.started_at > started
