"""The ledger keeps a handler's outcome when the store fails while recording it."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    EffectStoreError,
    MemoryStore,
    RunOptions,
    ToolCall,
)
from agent_ledger.backoff import COMMIT_RETRY, Backoff
from agent_ledger.engine import leases
from agent_ledger.options import StaleOptions
from agent_ledger.testing import FaultyStore
from tests.approvals import make_pending

CALL = ToolCall(workflow_id="wf", tool="payments.charge", args={"cents": 100})


def flaky_commit(failures: int, *, applied_then_fail: bool) -> FaultyStore[MemoryStore]:
    """A MemoryStore whose commit() raises like a dropped connection ``failures`` times.

    ``applied_then_fail``: the write lands, then the "connection" breaks, as when
    the server committed but the reply was lost. Otherwise it fails before
    writing. The error names the step as the real stores do (``commit``).
    """
    store = FaultyStore(MemoryStore())
    store.fail(
        "commit",
        times=failures,
        when="after" if applied_then_fail else "before",
        error=lambda: EffectStoreError("connection lost", operation="commit"),
    )
    return store


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases, "COMMIT_RETRY", Backoff(initial_s=0.001, max_s=0.001))


@pytest.mark.parametrize("applied_then_fail", [False, True])
async def test_transient_commit_failure_is_retried(applied_then_fail: bool) -> None:
    """One lost commit reply: run() still returns, the receipt says succeeded, one execution."""
    store = flaky_commit(1, applied_then_fail=applied_then_fail)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    executions = 0

    def charge(effect: object) -> str:
        nonlocal executions
        executions += 1
        return "ch_1"

    assert await ledger.run(CALL, charge) == "ch_1"
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.status, effect.result) == (EffectStatus.SUCCEEDED, "ch_1")
    assert executions == 1 and store.calls["commit"] == 2
    assert await ledger.run(CALL, charge) == "ch_1" and executions == 1


LEASE_MS = 400


async def test_persistent_commit_failure_retries_until_the_lease_ends() -> None:
    """When every try fails, run() keeps trying while its lease keeps others off
    the effect, then raises EffectStoreError; the effect stays processing and
    is taken over once the lease has lapsed, as after a crash."""
    store = flaky_commit(10**6, applied_then_fail=False)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    lease = RunOptions(stale=StaleOptions(after_ms=LEASE_MS))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(EffectStoreError, match="connection lost") as info:
        await ledger.run(CALL, lambda effect: "ch_1", lease)
    elapsed = loop.time() - started
    assert info.value.operation == "commit"
    # Up to the lease's end less a tenth kept in hand, never past the lease.
    assert 0.3 <= elapsed < LEASE_MS / 1000, elapsed
    assert store.calls["commit"] > 20  # tried all along (1 ms apart here), not three times
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.PROCESSING
    store.heal()
    await asyncio.sleep(LEASE_MS / 1000)
    assert await ledger.run(CALL, lambda effect: effect.executions, lease) == 2


async def test_an_outage_shorter_than_the_lease_costs_no_second_execution() -> None:
    """Commits failing for 1.5 s (more than the old retries' 1.25 s), with the
    real retry schedule and a 3 s lease: the outcome lands, the handler ran once."""
    store = FaultyStore(MemoryStore())
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    loop = asyncio.get_running_loop()
    until = loop.time() + 1.5

    def outage() -> BaseException:
        if loop.time() >= until:
            store.heal("commit")
        return EffectStoreError("connection lost", operation="commit")

    store.fail("commit", times=None, error=outage)
    executions = 0

    def charge(effect: object) -> str:
        nonlocal executions
        executions += 1
        return "ch_1"

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(leases, "COMMIT_RETRY", COMMIT_RETRY)  # the real schedule
        result = await ledger.run(CALL, charge, RunOptions(stale=StaleOptions(after_ms=3_000)))
    assert (result, executions) == ("ch_1", 1)
    assert loop.time() >= until
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.status, effect.executions) == (EffectStatus.SUCCEEDED, 1)


async def test_waiter_survives_failing_polls() -> None:
    """A duplicate caller whose polls fail for a while keeps waiting and gets the result."""
    import asyncio

    from agent_ledger import LedgerDefaults, RunOptions
    from agent_ledger.effects import CommitSucceeded
    from agent_ledger.options import ConcurrencyOptions

    store = FaultyStore(MemoryStore())
    fast = RunOptions(concurrency=ConcurrencyOptions(initial_interval_ms=5, max_interval_ms=10))
    ledger = EffectLedger(EffectLedgerOptions(store=store, defaults=LedgerDefaults(run=fast)))
    begun = await ledger.begin(CALL)
    store.fail("find", "claim", times=None)  # reads fail like a dropped connection
    waiter = asyncio.create_task(ledger.run(CALL, lambda e: "never"))
    await asyncio.sleep(0.1)
    assert store.failures.total() >= 2 and not waiter.done()
    store.heal()
    await ledger.commit(begun.effect.id, CommitSucceeded(result="done"))
    assert await asyncio.wait_for(waiter, 2) == "done"


async def test_polls_failing_until_the_deadline_raise_the_store_error() -> None:
    """If the store keeps failing, the caller gets the store's error, not a timeout."""
    from agent_ledger import RunOptions
    from agent_ledger.options import ConcurrencyOptions

    store = FaultyStore(MemoryStore())
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    await ledger.begin(CALL)
    store.fail("find", "claim", times=None)  # reads fail like a dropped connection
    options = RunOptions(
        concurrency=ConcurrencyOptions(
            wait_timeout_ms=100, initial_interval_ms=10, max_interval_ms=20
        )
    )
    with pytest.raises(EffectStoreError, match="connection lost"):
        await ledger.run(CALL, lambda e: "never", options)


async def test_failing_polls_on_a_ready_effect_back_off() -> None:
    """A ready effect whose polls fail is not polled in a tight loop: the backoff holds."""
    import asyncio

    from agent_ledger import RunOptions
    from agent_ledger.options import ConcurrencyOptions

    store = FaultyStore(MemoryStore())
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    key = (await make_pending(ledger, CALL)).idem_key
    await ledger.approve(key)
    store.fail("find", "claim", times=None)  # reads fail like a dropped connection
    options = RunOptions(
        concurrency=ConcurrencyOptions(
            wait_timeout_ms=300, initial_interval_ms=50, max_interval_ms=50
        )
    )
    waiter = asyncio.create_task(ledger.run(CALL, lambda e: "x", options))
    with pytest.raises(EffectStoreError):
        await waiter
    assert store.failures.total() <= 15  # about 300 ms / 50 ms polls, not thousands
