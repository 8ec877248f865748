"""tx: the effect record commits or rolls back with the caller's transaction."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable

import pytest

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
    RunOptions,
    ToolCall,
)
from agent_ledger.effects import CommitSucceeded
from agent_ledger.errors import EffectInFlightError, EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from tests.harness import ROW_LOCKING, StoreHarness

CALL = ToolCall(workflow_id="wf", tool="ledger.post", args={"amount": 5})
OTHER = ToolCall(workflow_id="wf", tool="ledger.post", args={"amount": 6})


class Abort(Exception):
    pass


async def test_run_in_a_committed_transaction_is_recorded(harness: StoreHarness) -> None:
    """An effect written inside a transaction is there once the block exits."""
    ledger = harness.ledger()
    async with harness.store.transaction() as tx:
        assert await ledger.run(CALL, lambda e: "posted", tx=tx) == "posted"
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.SUCCEEDED


async def test_run_in_a_rolled_back_transaction_leaves_no_trace(harness: StoreHarness) -> None:
    """If the caller's transaction rolls back, so does the effect: a retry runs again."""
    ledger = harness.ledger()
    with pytest.raises(Abort):
        async with harness.store.transaction() as tx:
            await ledger.run(CALL, lambda e: "posted", tx=tx)
            raise Abort
    assert await ledger.find_by_idem_key(ledger.idem_key(CALL)) is None
    assert await harness.raw_count() == 0
    assert await ledger.run(CALL, lambda e: "posted again") == "posted again"


async def test_begin_and_commit_in_one_transaction(harness: StoreHarness) -> None:
    """begin() and commit() accept the same tx; a rollback undoes both."""
    ledger = harness.ledger()
    with pytest.raises(Abort):
        async with harness.store.transaction() as tx:
            begun = await ledger.begin(CALL, tx=tx)
            assert await ledger.commit(begun.effect.id, CommitSucceeded(result=1), tx=tx)
            raise Abort
    assert await harness.raw_count() == 0
    async with harness.store.transaction() as tx:
        begun = await ledger.begin(CALL, tx=tx)
        assert await ledger.commit(begun.effect.id, CommitSucceeded(result=2), tx=tx)
    assert await ledger.run(CALL, lambda e: 3) == 2


async def test_rollback_restores_an_existing_effect(harness: StoreHarness) -> None:
    """Rolling back a replay undoes its dedup increment, not the earlier receipt."""
    ledger = harness.ledger()
    await ledger.run(CALL, lambda e: "first")
    with pytest.raises(Abort):
        async with harness.store.transaction() as tx:
            assert await ledger.run(CALL, lambda e: "x", tx=tx) == "first"
            raise Abort
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.result, effect.dedup_count) == ("first", 0)


async def test_a_replay_inside_a_transaction_reads_the_effect_without_writing_it(
    harness: StoreHarness,
) -> None:
    """Inside a transaction begin never writes an existing effect, so no duplicate is counted
    there (on PostgreSQL a write would lock the row until the transaction ends)."""
    ledger = harness.ledger()
    await ledger.run(CALL, lambda e: "first")
    async with harness.store.transaction() as tx:
        assert await ledger.run(CALL, lambda e: "x", tx=tx) == "first"
    assert await ledger.run(CALL, lambda e: "y") == "first"
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.dedup_count == 1  # the call outside counted


async def test_foreign_transaction_handles_are_rejected(harness: StoreHarness) -> None:
    """A tx that is not this store's gets a clear error and stores nothing."""
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError, match="tx"):
        await ledger.run(CALL, lambda e: 1, tx=object())
    assert await harness.raw_count() == 0


# -- inside a transaction the ledger never waits (issue 10, items 1 and 8) -------------


async def test_an_effect_held_elsewhere_fails_fast_inside_a_transaction(
    harness: StoreHarness,
) -> None:
    """No waiting and no takeover with tx=: the holder keeps its effect and commits."""
    ledger = harness.ledger()  # default options: a 30 s wait, a 15 s lease
    holder = await ledger.begin(CALL)
    ran: list[str] = []

    def handler(tag: str) -> Callable[[Effect], str]:
        def run(effect: Effect) -> str:
            ran.append(tag)
            return tag

        return run

    started = time.monotonic()
    with pytest.raises(EffectInFlightError, match="another worker") as info:
        async with harness.store.transaction() as tx:
            await ledger.run(CALL, handler("b"), tx=tx)
    assert time.monotonic() - started < 5.0
    assert info.value.idem_key == holder.effect.idem_key
    assert info.value.status is EffectStatus.PROCESSING
    assert ran == []
    assert await ledger.commit(
        holder.effect.id, CommitSucceeded(result="a"), attempt=holder.effect.attempt
    )
    assert await ledger.run(CALL, handler("c")) == "a"
    assert ran == []


async def test_a_stale_effect_is_not_taken_over_inside_a_transaction(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    await ledger.begin(CALL)
    await harness.age(10 * 60 * 1000)  # far past any lease
    with pytest.raises(EffectInFlightError):
        async with harness.store.transaction() as tx:
            await ledger.begin(CALL, tx=tx)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.attempt == 1


async def test_a_new_approval_gated_effect_is_refused_inside_a_transaction(
    harness: StoreHarness,
) -> None:
    """It could never be approved before the transaction commits: refuse, store nothing."""
    ledger = harness.ledger()
    async with harness.store.transaction() as tx:
        with pytest.raises(EffectLedgerValidationError, match="needs approval") as info:
            await ledger.run(CALL, lambda e: "x", RunOptions(requires_approval=True), tx=tx)
    assert info.value.field == "tx"
    assert await harness.raw_count() == 0


async def test_pending_and_approved_effects_inside_a_transaction(harness: StoreHarness) -> None:
    """Pending approval: fail fast. Approved: claimed and run inside the transaction."""
    ledger = harness.ledger()
    waiting = asyncio.create_task(
        ledger.run(
            CALL,
            lambda e: "approved run",
            RunOptions(
                requires_approval=True,
                concurrency=ConcurrencyOptions(approval_timeout_ms=50),
            ),
        )
    )
    with pytest.raises(EffectTimeoutError):
        await waiting
    with pytest.raises(EffectInFlightError, match="approval"):
        async with harness.store.transaction() as tx:
            await ledger.run(CALL, lambda e: "x", tx=tx)
    assert await ledger.approve(ledger.idem_key(CALL), by="ops")
    async with harness.store.transaction() as tx:
        assert await ledger.run(CALL, lambda e: "in tx", tx=tx) == "in tx"
    assert await ledger.run(CALL, lambda e: "again") == "in tx"


@pytest.mark.parametrize("rolled_back", [False, True], ids=["committed", "rolled-back"])
async def test_a_long_transaction_on_an_embedded_store_pauses_other_leases(
    harness: StoreHarness, rolled_back: bool
) -> None:
    """On Memory/SQLite a transaction stops every other worker's heartbeats, so
    its duration must not count against their leases: right after it, a
    waiter must not take over a worker that was alive when it began."""
    if harness.kind in ROW_LOCKING:
        pytest.skip(
            f"{harness.kind} locks rows, not the store: heartbeats go on beside a transaction"
        )
    lease = RunOptions(
        stale=StaleOptions(after_ms=1_000),
        concurrency=ConcurrencyOptions(wait_timeout_ms=200, initial_interval_ms=5),
    )
    ledger = harness.ledger(lease)
    held = await ledger.begin(CALL)  # a live worker: heartbeating, in its own eyes
    await harness.age(500)
    with contextlib.suppress(Abort):
        async with harness.store.transaction() as tx:
            await ledger.run(OTHER, lambda e: "inside", tx=tx)
            await harness.age(3_000)  # held the store for 3 leases
            if rolled_back:
                raise Abort
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, lambda e: "stolen")
    # The lease still runs out for a worker that is really gone.
    await harness.age(501)
    assert await ledger.run(CALL, lambda e: e.attempt) == 2
    taken = await ledger.get_effect(held.effect.id)
    assert taken is not None and taken.executions == 2


async def test_a_step_without_tx_from_inside_the_block_is_refused_not_hung(
    harness: StoreHarness,
) -> None:
    """On Memory/SQLite a step without ``tx=`` waits for the open transaction to
    end; from the task that holds it, that wait would never end. It is refused
    at once, naming the fix; another task's step still waits, then goes on."""
    if harness.kind in ROW_LOCKING:
        pytest.skip(f"{harness.kind} locks rows, not the store: such a step does not wait")
    ledger = harness.ledger()
    await ledger.run(CALL, lambda e: 1)
    key = ledger.idem_key(CALL)
    opened = asyncio.Event()

    async def other_worker() -> Effect | None:
        # Started before the block, so not part of it: it waits for it.
        await opened.wait()
        return await harness.store.find(key)

    other_task = asyncio.create_task(other_worker())
    async with harness.store.transaction() as tx:
        opened.set()
        await asyncio.sleep(0)
        steps: list[Callable[[], Awaitable[object]]] = [
            lambda: harness.store.find(key),
            lambda: ledger.stats(),
            lambda: ledger.run(OTHER, lambda e: 2),
        ]
        if harness.kind == "sqlite":  # MemoryStore has nothing to flush: it returns at once
            steps.append(lambda: harness.store.flush_counts())
        async with asyncio.timeout(5):
            for step in steps:
                with pytest.raises(EffectLedgerValidationError, match="tx=") as refused:
                    await step()
                assert refused.value.field == "tx"
        found = await harness.store.find(key, tx=tx)
        assert found is not None and found.result == 1
        await asyncio.sleep(0.01)
        assert not other_task.done()
    assert (await other_task) is not None
    assert await ledger.find_by_idem_key(ledger.idem_key(OTHER)) is None


def _started_inside(
    harness: StoreHarness,
) -> dict[str, Callable[[EffectLedger, object], Awaitable[object]]]:
    """Ways a step without ``tx=`` gets made inside a block by a task other than
    the block's own: each would wait for the transaction while the block waits
    for it (issue 13's adversarial pass, b01/b03/b06)."""

    async def gathered(ledger: EffectLedger, tx: object) -> object:
        return await asyncio.gather(ledger.run(OTHER, lambda e: 2))

    async def in_a_task(ledger: EffectLedger, tx: object) -> object:
        return await asyncio.create_task(ledger.run(OTHER, lambda e: 2))

    async def tools_gathered(ledger: EffectLedger, tx: object) -> object:
        @ledger.tool("send_email", workflow_id="wf")
        async def send_email(to: str) -> str:
            return "sent"

        return await asyncio.gather(send_email("a"), send_email("b"))

    async def sync_tool_in_a_sync_handler(ledger: EffectLedger, tx: object) -> object:
        @ledger.tool("inner", workflow_id="wf")
        def inner(a: int) -> int:
            return a

        # The sync handler runs in a worker thread; tool.sync() runs the inner
        # call as a new task on the ledger's loop, with the handler's context.
        return await ledger.run(CALL, lambda e: inner.sync(5), tx=tx)

    async def saga(ledger: EffectLedger, tx: object) -> object:
        @ledger.tool("saga_step")
        async def saga_step(a: int) -> int:
            return a

        async with ledger.saga("saga-in-tx"):
            return await saga_step(1)

    async def nested_transaction(ledger: EffectLedger, tx: object) -> object:
        async with harness.store.transaction():
            return None

    ways: dict[str, Callable[[EffectLedger, object], Awaitable[object]]] = {
        "gather": gathered,
        "task": in_a_task,
        "tools-gathered": tools_gathered,
        "sync-tool-in-sync-handler": sync_tool_in_a_sync_handler,
        "saga": saga,
        "nested-transaction": nested_transaction,
    }
    if sys.version_info < (3, 12):

        async def wait_for(ledger: EffectLedger, tx: object) -> object:
            # On 3.11 wait_for runs its awaitable in a task of its own.
            return await asyncio.wait_for(ledger.run(OTHER, lambda e: 2), 30)

        ways["wait_for"] = wait_for
    if harness.kind == "sqlite":

        async def close(ledger: EffectLedger, tx: object) -> object:
            await harness.store.close()
            return None

        ways["close"] = close
    return ways


_WAYS = [
    "gather",
    "task",
    "tools-gathered",
    "sync-tool-in-sync-handler",
    "saga",
    "nested-transaction",
    "wait_for",
    "close",
]


@pytest.mark.parametrize("way", _WAYS)
async def test_work_started_inside_the_block_is_refused_not_hung(
    harness: StoreHarness, way: str
) -> None:
    """A step without ``tx=`` made by a task the block started (gather, a task,
    wait_for on 3.11, a sync tool's inner call), a saga, a nested transaction()
    or SqliteStore.close() inside the block would wait for the transaction while
    the block waits for it, uncancellably. Each is refused at once, naming the
    fix; the block then rolls back and the store works on."""
    if harness.kind in ROW_LOCKING:
        pytest.skip(f"{harness.kind} locks rows, not the store: such a step does not wait")
    ways = _started_inside(harness)
    if way not in ways:
        pytest.skip(f"{way}: not a way to hang on {harness.kind} / this Python")
    ledger = harness.ledger()
    await ledger.run(ToolCall("warm", "up", {}), lambda e: 0)  # schema checked, as in an app
    async with asyncio.timeout(5):
        with pytest.raises(EffectLedgerValidationError) as refused:
            async with harness.store.transaction() as tx:
                await ways[way](ledger, tx)
    assert refused.value.field == "tx"
    assert "transaction() block" in str(refused.value)
    # Nothing of the block was kept, and the store is usable again.
    assert await ledger.find_by_idem_key(ledger.idem_key(OTHER)) is None
    assert await ledger.find_by_idem_key(ledger.idem_key(CALL)) is None
    if way == "saga":
        # Refused at its first step, as on SQLite: no saga row was left behind
        # (a saga is not part of the transaction, so it would not roll back).
        assert await harness.store.get_saga("saga-in-tx") is None  # type: ignore[attr-defined]
    if way != "close":
        assert await ledger.run(OTHER, lambda e: "after") == "after"


async def test_a_rollback_erases_the_receipt_so_the_next_call_runs_the_handler_again(
    harness: StoreHarness,
) -> None:
    # What the guide's Transactions section warns about (issue 26, item 7): an
    # external side effect made inside tx= outlives the rollback, its receipt
    # does not, and a retry runs the handler again; a service that honours
    # effect.idem_key sees the same key both times.
    ledger = harness.ledger()
    sent: list[str] = []

    def send(effect: Effect) -> str:
        sent.append(effect.idem_key)
        return "sent"

    with contextlib.suppress(RuntimeError):
        async with harness.store.transaction() as tx:
            await ledger.run(CALL, send, tx=tx)
            raise RuntimeError("the surrounding transaction failed")
    assert await ledger.find_by_idem_key(ledger.idem_key(CALL)) is None
    assert await ledger.run(CALL, send) == "sent"
    assert sent == [ledger.idem_key(CALL)] * 2
