"""The ledger keeps a handler's outcome when the store fails while recording it."""

from __future__ import annotations

import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    EffectStoreError,
    MemoryStore,
    ToolCall,
)
from agent_ledger.backoff import Backoff
from agent_ledger.engine import lifecycle
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
    monkeypatch.setattr(lifecycle, "COMMIT_RETRY", Backoff(initial_s=0.001, max_s=0.001, tries=3))


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


async def test_persistent_commit_failure_raises_the_store_error() -> None:
    """When every try fails, run() raises EffectStoreError and the effect stays claimable."""
    store = flaky_commit(10, applied_then_fail=False)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    with pytest.raises(EffectStoreError, match="connection lost") as info:
        await ledger.run(CALL, lambda effect: "ch_1")
    assert info.value.operation == "commit"
    assert store.calls["commit"] == 1 + 3  # the first try and the three retries patched in above
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.PROCESSING


async def test_waiter_survives_failing_polls() -> None:
    """A duplicate caller whose polls fail for a while keeps waiting and gets the result."""
    import asyncio

    from agent_ledger import CommitSucceeded, ConcurrencyOptions, LedgerDefaults, RunOptions

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
    from agent_ledger import ConcurrencyOptions, RunOptions

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

    from agent_ledger import ConcurrencyOptions, RunOptions

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
