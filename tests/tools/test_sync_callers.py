"""Sync callers: tools and run() from code that has no event loop, on every store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_ledger import (
    Effect,
    EffectFailedError,
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    EffectStatus,
    MemoryStore,
    ToolCall,
)
from agent_ledger.sync import open_ledger
from tests.harness import DSN, TEST_SCHEMA, StoreHarness, ensure_test_schema, require_postgres


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        require_postgres()
        asyncio.run(ensure_test_schema())
        yield f"{DSN}?schema={TEST_SCHEMA}"


@pytest.fixture
def ledger(url: str) -> Iterator[EffectLedger]:
    ledger = open_ledger(url)
    try:
        yield ledger
    finally:
        ledger.close_sync()


#: Sync loops already running when a test began: another test in this worker
#: may leave one behind (a ledger it never closed); these tests count only theirs.
_EARLIER: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _count_only_this_tests_sync_loops() -> None:
    _EARLIER.clear()
    _EARLIER.update(t for t in threading.enumerate() if t.name == "agent-ledger-sync")


def _sync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agent-ledger-sync" and t not in _EARLIER]


def test_sync_and_async_tools_run_once_from_sync_code(ledger: EffectLedger) -> None:
    runs: list[str] = []

    @ledger.tool("mail.send")
    def send(to: str, body: str = "hi", *, effect: Effect) -> dict[str, str]:
        runs.append(to)
        return {"to": to, "key": effect.idem_key}

    @ledger.tool("geo.locate")
    async def locate(city: str) -> list[object]:
        runs.append(city)
        return [city, 1.5]

    with ledger.workflow(f"w-{id(ledger)}"):
        first = send.sync("a@example.com")
        again = send.sync(to="a@example.com", body="hi")
        assert locate.sync("Oslo") == ["Oslo", 1.5]
        assert locate.sync(city="Oslo") == ["Oslo", 1.5]
        same = send.invoke_sync({"to": "a@example.com"}, call_id="c2")
    assert first == again == same
    assert runs == ["a@example.com", "Oslo"]


def test_the_workflow_scope_reaches_the_loop_and_is_required(ledger: EffectLedger) -> None:
    @ledger.tool("t")
    def t(x: int) -> int:
        return x

    with pytest.raises(EffectLedgerValidationError, match="outside a workflow"):
        t.sync(1)
    with ledger.workflow("scoped"):
        assert t.sync(1) == 1
    stored = ledger.call_sync(
        ledger.find_by_idem_key, ledger.idem_key(ToolCall("scoped", "t", {"x": 1}))
    )
    assert stored is not None and stored.status is EffectStatus.SUCCEEDED


def test_failures_raise_the_original_then_replay_as_effect_failed(ledger: EffectLedger) -> None:
    runs: list[int] = []

    @ledger.tool("boom")
    def boom() -> None:
        runs.append(1)
        raise KeyError("gone")

    with ledger.workflow("w-fail"):
        with pytest.raises(KeyError):
            boom.sync()
        with pytest.raises(EffectFailedError, match="gone"):
            boom.sync()
    assert runs == [1]


def test_run_sync_and_admin_calls(ledger: EffectLedger) -> None:
    call = ToolCall(workflow_id="w-admin", tool="deploy", args={"v": 2})
    from agent_ledger import ApprovalPendingError, RunOptions

    opts = RunOptions(requires_approval=True, wait_for_approval=False)
    with pytest.raises(ApprovalPendingError):
        ledger.run_sync(call, lambda _: "deployed", opts)
    assert ledger.call_sync(ledger.approve, ledger.idem_key(call), by="ops")
    assert ledger.run_sync(call, lambda _: "deployed", opts) == "deployed"


def test_close_sync_cancels_a_running_call_and_stops_the_thread(url: str) -> None:
    ledger = open_ledger(url)
    started = threading.Event()
    outcome: list[BaseException | object] = []

    @ledger.tool("slow")
    async def slow() -> str:
        started.set()
        await asyncio.sleep(60)
        return "late"

    def caller() -> None:
        with ledger.workflow("w-close"):
            try:
                outcome.append(slow.sync())
            except BaseException as exc:
                outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert started.wait(10)
    # Read the effect before closing; the store closes with the ledger.
    key = ledger.idem_key(ToolCall("w-close", "slow"))
    ledger.close_sync()
    thread.join(10)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], asyncio.CancelledError)
    assert _sync_threads() == []
    if not url.startswith("memory"):
        reopened = open_ledger(url)
        try:
            effect = reopened.call_sync(reopened.find_by_idem_key, key)
            assert effect is not None and effect.status is EffectStatus.CANCELED
        finally:
            reopened.close_sync()


async def test_sync_call_on_a_running_loop_raises_and_stores_nothing(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    @ledger.tool("t")
    def t() -> int:
        return 1

    with ledger.workflow("w"), pytest.raises(EffectLedgerValidationError, match="running event"):
        t.sync()
    assert await harness.raw_count() == 0


async def test_a_sync_tool_may_call_another_tool_synchronously(harness: StoreHarness) -> None:
    """Async code drives the ledger; a sync tool in its worker thread calls a tool's .sync()."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("inner")
    async def inner(x: int) -> int:
        runs.append("inner")
        return x * 2

    @ledger.tool("outer")
    def outer(x: int) -> int:
        runs.append("outer")
        return inner.sync(x) + 1

    async with ledger.workflow("w"):
        assert await outer(3) == 7
        assert await outer(3) == 7
        assert await inner(3) == 6
    assert runs == ["outer", "inner"]
    assert _sync_threads() == []  # no background loop was needed


async def test_async_use_beside_a_running_background_loop_is_refused() -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))

    @ledger.tool("t", workflow_id="w")
    def t() -> int:
        return 1

    await asyncio.to_thread(t.sync)
    try:
        with pytest.raises(EffectLedgerValidationError, match="background event loop"):
            await t()
    finally:
        await asyncio.to_thread(ledger.close_sync)
    assert await t() == 1  # after close_sync, async use is fine again


def test_many_threads_share_one_background_loop() -> None:
    """Sync callers on many threads at once: one loop, one execution per key."""
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    runs: list[int] = []

    @ledger.tool("count", workflow_id="w")
    def count(n: int) -> int:
        runs.append(n)
        return n

    results: list[int] = []
    barrier = threading.Barrier(8)

    def caller(i: int) -> None:
        barrier.wait()
        results.append(count.sync(i % 2))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    try:
        assert sorted(results) == [0, 0, 0, 0, 1, 1, 1, 1]
        assert sorted(runs) == [0, 1]
        assert len(_sync_threads()) == 1
    finally:
        ledger.close_sync()
    assert _sync_threads() == []


def _close_while_calling(url: str, round_: int) -> None:
    ledger = open_ledger(url)

    @ledger.tool("work", workflow_id=f"race-{round_}")
    async def work(i: int) -> int:
        await asyncio.sleep(0.001)
        return i

    stop = threading.Event()
    outcomes: list[str] = []

    def caller(offset: int) -> None:
        i = offset
        while not stop.is_set():
            try:
                work.sync(i)
                outcomes.append("ok")
            except (asyncio.CancelledError, EffectLedgerValidationError) as exc:
                outcomes.append(type(exc).__name__)
            i += 8

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    threading.Event().wait(0.05)
    ledger.close_sync()
    stop.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a caller is still blocked"
    assert outcomes, "the callers made calls"


def test_close_sync_racing_callers_leaves_nobody_waiting_and_nothing_processing(
    tmp_path: Path,
) -> None:
    """Threads keep calling .sync() while close_sync() runs: each call ends (a result, a
    cancellation or a clear refusal), and no effect is left processing."""
    url = f"sqlite:///{tmp_path / 'race.db'}"
    for round_ in range(5):
        _close_while_calling(url, round_)
    check = open_ledger(url)
    try:
        page = check.call_sync(check.list_effects, status=EffectStatus.PROCESSING)
        assert page.effects == []
        assert check.call_sync(check.list_effects).effects, "the rounds started effects"
    finally:
        check.close_sync()


def test_a_tool_raising_system_exit_does_not_kill_the_loop() -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))

    @ledger.tool("cli.run", workflow_id="w")
    def cli_run() -> None:
        raise SystemExit(2)

    @ledger.tool("ok", workflow_id="w")
    def ok(x: int) -> int:
        return x

    try:
        with pytest.raises(SystemExit):
            cli_run.sync()
        (loop_thread,) = _sync_threads()
        assert ok.sync(1) == 1
        assert _sync_threads() == [loop_thread], "the same loop serves the next call"
    finally:
        ledger.close_sync()


async def test_many_sync_tools_calling_tools_synchronously_at_once(
    harness: StoreHarness,
) -> None:
    """More outer sync tools at once than the loop's default executor has threads, each
    blocking on an inner sync tool: all finish (handlers have a pool of their own)."""
    ledger = harness.ledger()

    @ledger.tool("inner")
    def inner(x: int) -> int:
        return x * 2

    @ledger.tool("outer")
    def outer(x: int) -> int:
        return inner.sync(x) + 1

    async with ledger.workflow("w"):
        results = await asyncio.wait_for(asyncio.gather(*(outer(i) for i in range(12))), 60)
    assert results == [i * 2 + 1 for i in range(12)]


def test_interpreter_exit_records_a_running_sync_call(tmp_path: Path) -> None:
    """The main thread returns while another thread is inside .sync() on SQLite: the
    effect is recorded canceled (not left processing, to run again after its lease)."""
    import subprocess
    import sys
    import textwrap

    db = tmp_path / "exit.db"
    script = textwrap.dedent(
        f"""
        import threading, time
        from agent_ledger.sync import open_ledger
        ledger = open_ledger("sqlite:///{db}")

        @ledger.tool("mail.send", workflow_id="w")
        def send(to: str) -> str:
            time.sleep(0.5)
            return "sent"

        def worker():
            try:
                send.sync("ada")
            except BaseException:
                pass

        threading.Thread(target=worker).start()
        time.sleep(0.2)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    ledger = open_ledger(f"sqlite:///{db}")
    try:
        page = ledger.call_sync(ledger.list_effects)
        assert [(e.status, e.executions) for e in page.effects] == [(EffectStatus.CANCELED, 1)]
    finally:
        ledger.close_sync()
