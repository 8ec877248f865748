"""agent_ledger.testing: the fault-injecting wrapper, the ledger builder, the re-exports."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from agent_ledger import (
    Effect,
    EffectError,
    EffectStatus,
    EffectStoreError,
    LedgerHooks,
    MemoryStore,
    RunOptions,
    Store,
    ToolCall,
)
from agent_ledger import clock as clock_module
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.stores.base import Decision, EffectQuery, Held, NewEffect
from agent_ledger.testing import STORE_STEPS, FaultyStore, ManualClock, build_ledger

CALL = ToolCall(workflow_id="wf", tool="t", args={"n": 1})
KEY = build_ledger(MemoryStore()).idem_key(CALL)
NEW = NewEffect(
    idem_key=KEY,
    workflow_id="wf",
    call_id=None,
    tool="t",
    args_canonical='{"n":1}',
    resource_id_canonical=None,
)


def faulty() -> FaultyStore[MemoryStore]:
    return FaultyStore(MemoryStore())


def step_calls(store: Store, effect_id: str) -> dict[str, Callable[[], Awaitable[object]]]:
    """One harmless call of each faultable step, by step name."""
    return {
        "begin": lambda: store.begin(NEW),
        "claim": lambda: store.claim(KEY, stale_after_ms=0),
        "heartbeat": lambda: store.heartbeat([Held(effect_id, 1)]),
        "record_try": lambda: store.record_try(
            effect_id, attempt=1, error=EffectError("boom", "E"), error_type="OSError"
        ),
        "commit": lambda: store.commit(
            effect_id, attempt=1, status=EffectStatus.SUCCEEDED, result_json="1", error=None
        ),
        "release": lambda: store.release(effect_id, attempt=1),
        "transition": lambda: store.transition(KEY, target=EffectStatus.REQUIRES_APPROVAL),
        # A succeeded effect is never reopened: the store says None, changing nothing.
        "reopen": lambda: store.reopen(KEY, by="ops", reason="again"),
        # Not failed: nothing to retry, and nothing changes.
        "retry_failed": lambda: store.retry_failed(KEY, attempt=1, lease_ms=1_000),
        # Finished by now: none of the three applies, and none changes anything.
        "mark_started": lambda: store.mark_started(effect_id, attempt=1, worker="w"),
        "park": lambda: store.park(KEY, stale_after_ms=1, error=EffectError("?", "x")),
        "settle": lambda: store.settle(KEY, target=EffectStatus.READY, decision=Decision(by="ops")),
        "get": lambda: store.get(effect_id),
        "find": lambda: store.find(KEY),
        "find_legacy": lambda: store.find_legacy("0" * 64),
        "list_effects": lambda: store.list_effects(EffectQuery()),
        "stats": lambda: store.stats(),
        "flush_counts": lambda: store.flush_counts(),
        "purge": lambda: store.purge(
            older_than=timedelta(days=1), statuses=frozenset({EffectStatus.SUCCEEDED})
        ),
        "create_schema": lambda: store.create_schema(),
        "migrate": lambda: store.migrate(),
        "check_schema": lambda: store.check_schema(),
    }


def test_the_wrapper_is_a_store() -> None:
    """Statically and at runtime, so it can stand wherever a Store is expected."""
    store: Store = faulty()
    assert isinstance(store, Store)


def test_the_steps_are_exactly_the_protocol_methods_that_reach_the_backend() -> None:
    """STORE_STEPS is every Store method but subscribe/transaction/close, and each is forwarded."""
    protocol = {
        name for name in vars(Store) if not name.startswith("_") and callable(vars(Store)[name])
    }
    assert set(STORE_STEPS) == protocol - {"subscribe", "transaction", "close"}
    assert len(STORE_STEPS) == len(set(STORE_STEPS))
    for name in protocol:
        assert name in vars(FaultyStore), f"FaultyStore does not forward {name}"


async def test_every_step_is_forwarded_and_counted() -> None:
    """Without faults, each step returns what the wrapped store returns."""
    store = faulty()
    begun = await store.begin(NEW)
    assert begun.created and len(store.inner) == 1
    calls = step_calls(store, begun.effect.id)
    for step in STORE_STEPS:
        await calls[step]()
    assert store.calls == dict.fromkeys(STORE_STEPS, 1) | {"begin": 2}
    assert not store.failures
    effect = await store.inner.find(KEY)
    assert effect is not None and effect.status is EffectStatus.SUCCEEDED
    assert effect.dedup_count == 1


@pytest.mark.parametrize("step", STORE_STEPS)
async def test_every_step_can_fail(step: str) -> None:
    """A fault raises EffectStoreError naming the step, then the step works again."""
    store = faulty()
    begun = await store.inner.begin(NEW)
    call = step_calls(store, begun.effect.id)[step]
    store.fail(step)
    with pytest.raises(EffectStoreError, match="connection lost") as info:
        await call()
    assert info.value.operation == step
    assert (store.calls[step], store.failures[step]) == (1, 1)
    await call()
    assert (store.calls[step], store.failures[step]) == (2, 1)


async def test_a_fault_before_the_step_changes_nothing() -> None:
    """The default fault is an outage: the store never sees the call."""
    store = faulty()
    store.fail("begin")
    with pytest.raises(EffectStoreError) as info:
        await store.begin(NEW)
    assert info.value.idem_key == KEY
    assert len(store.inner) == 0


async def test_a_lost_reply_applies_the_step_then_raises() -> None:
    """when="after": the write lands, the caller only sees the error."""
    store = faulty()
    begun = await store.begin(NEW)
    store.fail("commit", when="after")
    with pytest.raises(EffectStoreError) as info:
        await store.commit(
            begun.effect.id, attempt=1, status=EffectStatus.SUCCEEDED, result_json='"x"', error=None
        )
    assert info.value.effect_id == begun.effect.id
    effect = await store.inner.get(begun.effect.id)
    assert effect is not None and (effect.status, effect.result) == (EffectStatus.SUCCEEDED, "x")
    # The retry a careful caller makes finds the compare-and-set already done.
    assert not await store.commit(
        begun.effect.id, attempt=1, status=EffectStatus.SUCCEEDED, result_json='"x"', error=None
    )


async def test_times_counts_down_and_none_fails_until_healed() -> None:
    """times=N fails the next N calls; times=None every call until heal()."""
    store = faulty()
    store.fail("find", "stats", times=2)
    for _ in range(2):
        with pytest.raises(EffectStoreError):
            await store.find(KEY)
    assert await store.find(KEY) is None
    store.fail("find", times=None)
    for _ in range(5):
        with pytest.raises(EffectStoreError):
            await store.find(KEY)
    store.heal("find")
    assert await store.find(KEY) is None
    assert store.failures == {"find": 7}
    with pytest.raises(EffectStoreError):
        await store.stats()  # still armed: heal("find") left it alone
    store.fail("get", times=None)
    store.heal()
    assert await store.get("no-such-id") is None and await store.stats()


async def test_a_custom_error_is_raised_instead() -> None:
    """error= builds what to raise: here a driver-style error the ledger does not know."""
    store = faulty()
    store.fail("begin", error=lambda: OSError("network is unreachable"))
    with pytest.raises(OSError, match="unreachable"):
        await store.begin(NEW)


def test_unknown_steps_and_bad_settings_are_refused() -> None:
    """A misspelt step must fail the test, not silently inject nothing."""
    store = faulty()
    with pytest.raises(ValueError, match="unknown store steps"):
        store.fail("commitx")
    with pytest.raises(ValueError, match="unknown store steps"):
        store.fail()
    with pytest.raises(ValueError, match="times"):
        store.fail("find", times=0)
    with pytest.raises(ValueError, match="when"):
        store.fail("find", when="during")  # type: ignore[arg-type]  # a wrong value on purpose
    with pytest.raises(ValueError, match="unknown store steps"):
        store.slow("subscribe", seconds=1)


async def test_slow_delays_the_step() -> None:
    """slow() adds latency to each call of a step; 0 removes it."""
    store = faulty()
    store.slow("find", seconds=0.05)
    started = time.monotonic()
    await store.find(KEY)
    assert time.monotonic() - started >= 0.045
    store.slow("find", seconds=0)
    started = time.monotonic()
    await store.find(KEY)
    assert time.monotonic() - started < 0.045


async def test_transactions_and_subscriptions_are_the_wrapped_stores() -> None:
    """A tx from the wrapper works with its steps, and subscribers hear the commit."""
    store = faulty()
    async with store.transaction() as tx:
        begun = await store.begin(NEW, tx=tx)
    assert await store.inner.find(KEY) is not None
    async with store.subscribe(KEY) as changes:
        assert await store.commit(
            begun.effect.id, attempt=1, status=EffectStatus.FAILED, result_json=None,
            error=EffectError("no"),
        )  # fmt: skip
        assert await changes.wait(1.0)
    await store.close()


async def test_a_failed_step_rolls_back_its_transaction() -> None:
    """An injected fault inside a transaction behaves like a real one: nothing lands."""
    store = faulty()
    store.fail("transition")
    with pytest.raises(EffectStoreError):
        async with store.transaction() as tx:
            await store.begin(NEW, tx=tx)
            await store.transition(KEY, target=EffectStatus.CANCELED, tx=tx)
    assert len(store.inner) == 0


async def test_build_ledger_applies_defaults_and_hooks() -> None:
    """The builder is EffectLedger(EffectLedgerOptions(...)) in one call."""
    notified: list[str] = []

    async def notify(effect: Effect) -> None:
        notified.append(effect.idem_key)

    store = MemoryStore()
    hooks = LedgerHooks(requires_approval=lambda call: True, on_approval_required=notify)
    quick = RunOptions(concurrency=ConcurrencyOptions(approval_timeout_ms=50))
    ledger = build_ledger(store, defaults=quick, hooks=hooks)
    assert ledger.store is store
    with pytest.raises(EffectTimeoutError):  # the hook asked for approval; the default gave up
        await ledger.begin(CALL)
    assert notified == [KEY]
    plain = build_ledger(MemoryStore())
    assert (await plain.begin(CALL)).effect.status is EffectStatus.PROCESSING


async def test_a_ledger_on_a_faulty_store_retries_a_lost_commit() -> None:
    """The wrapper under a real ledger: a lost commit reply does not run the handler twice."""
    store = faulty()
    store.fail("commit", when="after")
    ledger = build_ledger(store)
    runs: list[int] = []

    async def handler(effect: object) -> str:
        runs.append(1)
        await asyncio.sleep(0)
        return "done"

    assert await ledger.run(CALL, handler) == "done"
    assert await ledger.run(CALL, handler) == "done"
    assert runs == [1] and store.failures == {"commit": 1}


def test_manual_clock_is_the_clock_modules() -> None:
    assert ManualClock is clock_module.ManualClock


def test_imports_without_psycopg() -> None:
    """Only StatementCounter needs psycopg, and only when it is used."""
    # A None entry in sys.modules makes `import psycopg` raise ImportError.
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import agent_ledger.testing as t\n"
        "assert t.FaultyStore and t.StatementCounter and t.build_ledger\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
