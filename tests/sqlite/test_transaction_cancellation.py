"""SqliteStore.transaction() cancelled or failing at each of its steps (issue 10, item 5).

The store's connection is its only one, and a statement its thread has
started cannot be interrupted: a transaction that a cancelled caller leaves
open would hold the database's write lock for ever, and the next step would
fail with "cannot start a transaction within a transaction". After every
scenario here the store still works, and another connection (as another
process would) gets the write lock at once.

To catch the store at one statement, a test pauses (or fails) its thread
there with a sqlite3 progress handler on the store's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent_ledger import EffectStoreError, ToolCall
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.testing import build_ledger

INSIDE = ToolCall(workflow_id="wf", tool="inside.tx", args={"n": 1})
AFTER = ToolCall(workflow_id="wf", tool="after", args={})


@contextlib.contextmanager
def write_lock_held(db: Path) -> Iterator[None]:
    """Another connection holds the database's write lock until the block ends."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def write_lock_free(db: Path) -> bool:
    """Whether another connection gets the write lock without waiting."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


class Pause:
    """Stops the store's thread when it runs a statement starting with ``prefix``."""

    def __init__(self, prefix: str, *, fail: bool = False) -> None:
        self.prefix = prefix
        self.fail = fail
        self.reached = threading.Event()
        self.release = threading.Event()
        self._current: str | None = None

    def traced(self, statement: str) -> None:
        self._current = statement

    def progress(self) -> int:
        if self.reached.is_set() or not (self._current or "").startswith(self.prefix):
            return 0
        self.reached.set()
        self.release.wait(10)
        return 1 if self.fail else 0  # non-zero interrupts the statement

    async def wait_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 10), f"{self.prefix} never ran"


@contextlib.asynccontextmanager
async def paused(store: SqliteStore, pause: Pause) -> AsyncIterator[Pause]:
    def install(on: bool) -> None:
        conn = store._conn
        conn.set_trace_callback(pause.traced if on else None)
        conn.set_progress_handler(pause.progress if on else None, 1)

    loop = asyncio.get_running_loop()
    await loop.run_in_executor(store._executor, install, True)
    try:
        yield pause
    finally:
        pause.release.set()
        await loop.run_in_executor(store._executor, install, False)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    sqlite_store = SqliteStore(tmp_path / "ledger.db", synchronous="NORMAL", busy_timeout_ms=5_000)
    yield sqlite_store
    await sqlite_store.close()


async def run_in_transaction(store: SqliteStore, *, fail: bool = False) -> None:
    ledger = build_ledger(store)
    async with store.transaction() as tx:
        await ledger.run(INSIDE, lambda e: "written inside", tx=tx)
        if fail:
            raise ValueError("the business transaction failed")


async def assert_usable(store: SqliteStore, *, inside_committed: bool = False) -> None:
    """The store runs a call, the lock is free afterwards, and the transaction's
    effect is there only if it committed."""
    ledger = build_ledger(store)
    assert await asyncio.wait_for(ledger.run(AFTER, lambda e: "after"), 10) == "after"
    assert write_lock_free(store.path)
    inside = await store.find(ledger.idem_key(INSIDE))
    assert (inside is not None) == inside_committed
    async with store.transaction() as tx:  # and a new transaction begins and commits
        await ledger.run(ToolCall(workflow_id="wf", tool="again"), lambda e: 1, tx=tx)
    assert write_lock_free(store.path)


async def test_cancelled_while_begin_waits_for_the_lock(store: SqliteStore) -> None:
    """Cancelled while BEGIN IMMEDIATE waits for another connection's lock: once it gets
    it, the transaction is rolled back, and the store and the lock stay usable."""
    with write_lock_held(store.path):
        task = asyncio.create_task(run_in_transaction(store))
        await asyncio.sleep(0.3)  # BEGIN IMMEDIATE is waiting on the store's thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_usable(store)


async def test_cancelled_while_begin_runs(store: SqliteStore) -> None:
    """Cancelled while the store's thread runs BEGIN: rolled back, store usable."""
    async with paused(store, Pause("BEGIN")) as pause:
        task = asyncio.create_task(run_in_transaction(store))
        await pause.wait_reached()
        task.cancel()
        pause.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_usable(store)


async def test_cancelled_during_a_statement_inside(store: SqliteStore) -> None:
    """Cancelled while a statement inside the block runs: rolled back, store usable."""
    async with paused(store, Pause("INSERT")) as pause:
        task = asyncio.create_task(run_in_transaction(store))
        await pause.wait_reached()
        task.cancel()
        pause.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_usable(store)


async def test_cancelled_during_commit(store: SqliteStore) -> None:
    """Cancelled while COMMIT runs: the COMMIT decides (here it lands), store usable."""
    async with paused(store, Pause("COMMIT")) as pause:
        task = asyncio.create_task(run_in_transaction(store))
        await pause.wait_reached()
        task.cancel()
        pause.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_usable(store, inside_committed=True)


async def test_a_failed_commit_rolls_back(store: SqliteStore) -> None:
    """COMMIT fails: transaction() raises EffectStoreError, the block is rolled back
    and the lock released."""
    async with paused(store, Pause("COMMIT", fail=True)) as pause:
        pause.release.set()
        with pytest.raises(EffectStoreError, match="interrupted") as info:
            await run_in_transaction(store)
        assert info.value.operation == "transaction"
    await assert_usable(store)


async def test_cancelled_during_a_commit_that_fails(store: SqliteStore) -> None:
    """Cancelled while a COMMIT runs that then fails: rolled back, store usable."""
    async with paused(store, Pause("COMMIT", fail=True)) as pause:
        task = asyncio.create_task(run_in_transaction(store))
        await pause.wait_reached()
        task.cancel()
        pause.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_usable(store)


async def test_cancelled_during_rollback(store: SqliteStore) -> None:
    """The block raised and the caller is cancelled during the ROLLBACK: it still
    completes, store usable."""
    async with paused(store, Pause("ROLLBACK")) as pause:
        task = asyncio.create_task(run_in_transaction(store, fail=True))
        await pause.wait_reached()
        task.cancel()
        pause.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_usable(store)


async def test_a_step_whose_commit_fails_rolls_back(store: SqliteStore) -> None:
    """A step outside any transaction (its own BEGIN ... COMMIT) whose COMMIT fails
    raises EffectStoreError and leaves no transaction open."""
    ledger = build_ledger(store)
    async with paused(store, Pause("COMMIT", fail=True)) as pause:
        pause.release.set()
        with pytest.raises(EffectStoreError, match="interrupted"):
            await ledger.begin(INSIDE)
    await assert_usable(store)
