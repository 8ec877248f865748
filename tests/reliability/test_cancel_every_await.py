"""Cancellation at every await: run() cancelled at its k-th suspension, for every k.

A run's task is driven through :class:`CancelAt`, which counts the times
``run()`` really suspends (an await that waits for something) and cancels the
task at the k-th. Trying k = 1, 2, ... until a run completes first hits every
await point of a fresh, a replayed and an approval-gated run in turn, on
every store, whatever the timing of the I/O underneath. Where a cancellation
lands inside a store round trip (before or after the server acted) varies, so
each path is swept ``ROUNDS`` times. (MemoryStore's steps never suspend: on it
only the handler and waiting are await points.)

After each cancelled run:

* nothing is left ``processing``: ``run()`` has raised, so nobody owns the
  effect, and a ``processing`` row would sit there until its lease ran out
  (then be taken over: a second execution if the handler had run);
* the handler ran at most once for the key, counting a follow-up ``run()``
  of the same call, as an agent retrying it would make;
* the store still works: a ``run()`` of another key succeeds.
"""

from __future__ import annotations

import asyncio
import functools
import time
import types
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

import pytest

from agent_ledger import (
    Effect,
    EffectDeniedError,
    EffectLedger,
    EffectStatus,
    LedgerHooks,
    RunOptions,
    ToolCall,
)
from agent_ledger.options import ConcurrencyOptions
from tests.harness import StoreHarness
from tests.reliability.conftest import report

pytestmark = pytest.mark.slow
T = TypeVar("T")

#: A run that still suspends this often has a wait loop that never ends.
MAX_SUSPENSIONS = 2_000
#: Bound on every single step of the check, so a wedged store fails fast.
STEP_TIMEOUT_S = 10.0
#: fresh: a new key; replay: the effect already succeeded; approval: an
#: approval-gated call approved by another task; sync: fresh, with a plain
#: (non-async) handler, which run() calls in a worker thread.
PATHS = ["fresh", "replay", "approval", "sync"]
#: Sweeps per path, so each await point is hit with different I/O timings.
ROUNDS = 30


class CancelAt:
    """Drives a coroutine, counting its suspensions; cancels its task at the ``k``-th.

    ``task.cancel()`` is called from inside the task at the moment the
    coroutine hands the event loop the future it waits for, so the
    cancellation lands exactly at that await (asyncio cancels the future,
    and ``CancelledError`` is raised where the coroutine waits on it).
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.suspensions = 0
        #: Where the k-th suspension happened (see ``ledger_frame``).
        self.site = ""

    @types.coroutine
    def drive(self, coro: Coroutine[Any, Any, T]) -> Generator[Any, Any, T]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            self.suspensions += 1
            if self.suspensions == self.k:
                self.site = ledger_frame(coro)
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
            try:
                value, error = (yield yielded), None
            except BaseException as exc:
                value, error = None, exc


def ledger_frame(coro: Coroutine[Any, Any, Any]) -> str:
    """Where ``coro`` is suspended: the engine function and the store step it is in
    (``_wait > postgres.claim``; ``acquire > begin (own task)`` for a step the engine
    runs in a task of its own), or ``handler``."""
    engine, store = "", ""
    awaited: Any = coro
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        if module == "agent_ledger.engine.ownership" and not store:
            store = f"{frame.f_locals.get('name', '?')} (own task)"  # type: ignore[union-attr]
        elif module.startswith("agent_ledger.engine") and not store:
            engine = frame.f_code.co_name  # type: ignore[union-attr]
        elif module.startswith("agent_ledger.stores.") and not store:
            step = frame.f_code.co_name  # type: ignore[union-attr]
            store = f"{module.rsplit('.', 1)[-1].lstrip('_')}.{step}"
        elif module == __name__ and engine:
            return "handler"  # our handler, called by the engine
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return f"{engine} > {store}" if store else engine


class RunPath:
    """One path through run(): its calls, handler, and the executions it caused."""

    def __init__(self, harness: StoreHarness, path: str) -> None:
        self.path = path
        self.workflow = f"cancel-{path}-{uuid.uuid4().hex[:8]}"
        self.executions: Counter[int] = Counter()
        self.approvals: set[asyncio.Task[bool]] = set()
        self.ledger: EffectLedger = harness.ledger(
            RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=5_000))
        )
        self.options = RunOptions(requires_approval=path == "approval")
        # "Approved by another task": the hook starts the approval and returns.
        self.hooks = LedgerHooks(on_approval_required=self._approve_soon)

    async def _approve_soon(self, effect: Effect) -> None:
        task = asyncio.create_task(self.ledger.approve(effect.idem_key, by="another task"))
        self.approvals.add(task)

    def call(self, k: int) -> ToolCall:
        return ToolCall(workflow_id=self.workflow, tool="side.effect", args={"k": k})

    def run(self, k: int) -> Coroutine[Any, Any, object]:
        async def handler(effect: Effect) -> dict[str, int]:
            self.executions[k] += 1
            await asyncio.sleep(0)  # an await inside the handler: a cancel point too
            return {"k": k}

        def sync_handler(effect: Effect) -> dict[str, int]:
            self.executions[k] += 1
            return {"k": k}

        chosen = sync_handler if self.path == "sync" else handler
        return self.ledger.run(self.call(k), chosen, self.options, hooks=self.hooks)

    async def settle(self) -> None:
        """Let approvals started by hooks land (they belong to other tasks)."""
        if self.approvals:
            await asyncio.gather(*self.approvals, return_exceptions=True)
            self.approvals.clear()


async def run_cancelled_at(
    k: int, make: Callable[[], Coroutine[Any, Any, object]]
) -> tuple[str, str]:
    """Run ``make()`` in a task cancelled at its k-th suspension: how it ended, and
    where the cancellation landed."""
    stepper = CancelAt(k)

    async def driven() -> object:
        return await stepper.drive(make())

    task = asyncio.create_task(driven())
    await asyncio.wait([task], timeout=STEP_TIMEOUT_S)
    if not task.done():
        task.cancel()
        await asyncio.wait([task])
        return "hung", stepper.site
    if task.cancelled():
        return "cancelled", stepper.site
    if task.exception() is not None:
        return type(task.exception()).__name__, stepper.site
    # Finished before its k-th suspension: k is past the last await point.
    return ("completed" if stepper.suspensions < k else "cancellation swallowed"), stepper.site


@pytest.mark.parametrize("path", PATHS)
async def test_cancel_at_every_await(harness: StoreHarness, path: str) -> None:
    """Cancelled at any await, run() leaves nothing processing, runs the handler at
    most once per key, and leaves the store usable."""
    p = RunPath(harness, path)
    started = time.monotonic()
    # The ledger's first run also checks the schema (and, waiting, starts the
    # Postgres listener): warm up, so every run of the sweep has the same awaits.
    assert await p.run(0) == {"k": 0}
    after_cancel: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    sites: Counter[str] = Counter()
    left_processing: list[str] = []
    unusable: list[tuple[int, str]] = []
    follow_ups: Counter[str] = Counter()
    await_points: list[int] = []
    n = 0  # one key per cancelled run
    for _ in range(ROUNDS):
        k = 0
        while True:
            k += 1
            n += 1
            assert k <= MAX_SUSPENSIONS, f"run() suspended {k} times: a wait that never ends?"
            if path == "replay":
                assert await p.run(n) == {"k": n}  # the effect exists and succeeded
            outcome, site = await run_cancelled_at(k, functools.partial(p.run, n))
            await p.settle()
            if outcome == "completed":
                await_points.append(k - 1)
                break
            ended[outcome] += 1
            sites[site] += 1
            async with asyncio.timeout(STEP_TIMEOUT_S):
                effect = await p.ledger.find_by_idem_key(p.ledger.idem_key(p.call(n)))
            status = "absent" if effect is None else effect.status.value
            after_cancel[status] += 1
            if effect is not None and effect.status is EffectStatus.PROCESSING:
                # Nobody owns it: it would wait out its lease, then be taken over.
                left_processing.append(f"k={k} in {site}")
            else:
                follow_ups[await follow_up(p, n, effect)] += 1
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    other = ToolCall(workflow_id=p.workflow, tool="other", args={"n": n})
                    assert await p.ledger.run(other, lambda e: "ok") == "ok"
            except BaseException as exc:  # a wedged store shows up as a timeout
                unusable.append((n, repr(exc)))
                if len(unusable) > 3:
                    break
    executed_twice = sorted(key for key, count in p.executions.items() if count > 1)
    report(
        f"cancellation at every await ({harness.kind}, {path})",
        await_points=max(await_points),
        runs_cancelled=sum(ended.values()),
        cancelled_in=dict(sites),
        run_ended=dict(ended),
        status_after_cancel=dict(after_cancel),
        left_processing=len(left_processing),
        follow_up=dict(follow_ups),
        executed_twice=len(executed_twice),
        store_unusable=len(unusable),
        seconds=round(time.monotonic() - started, 1),
    )
    assert set(ended) <= {"cancelled"}, f"run() did not end with CancelledError: {ended}"
    assert left_processing == [], f"left processing with no owner: {Counter(left_processing)}"
    assert executed_twice == [], f"handler ran twice for keys {executed_twice}"
    assert unusable == [], f"store unusable after cancellation: {unusable}"


async def follow_up(p: RunPath, k: int, effect: Effect | None) -> str:
    """Call again, as an agent would after its cancelled attempt; how that ended."""
    if effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL:
        # The cancelled run may have gone before its hook could ask anyone.
        await p.ledger.approve(effect.idem_key, by="follow-up")
    try:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            result = await p.run(k)
    except EffectDeniedError:
        return "denied (recorded canceled)"
    finally:
        await p.settle()
    assert result == {"k": k}
    return "result"
