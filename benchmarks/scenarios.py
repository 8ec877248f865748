"""The benchmark scenarios, each returning plain figures for the report."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_ledger import (
    EffectLedger,
    EffectStatus,
    MemoryStore,
    RunOptions,
    ToolCall,
)
from agent_ledger.stores.base import NewEffect, Store
from agent_ledger.testing import build_ledger
from benchmarks.floors import handler
from benchmarks.timing import Figure, figure, percentile, repeat

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 32


@dataclass
class Sizes:
    calls: int
    repetitions: int
    contended_tasks: int
    approval_trials: int
    table_sizes: tuple[int, int]
    rss_effects: int
    scaling_calls: int

    @classmethod
    def choose(cls, quick: bool) -> Sizes:
        if quick:
            return cls(300, 5, 50, 10, (10_000, 100_000), 20_000, 300)
        return cls(2_000, 5, 50, 20, (10_000, 1_000_000), 100_000, 2_000)


def calls_for(run_id: str, n: int) -> list[ToolCall]:
    return [
        ToolCall(workflow_id=f"bench-{run_id}", tool="bench.tool", args={"i": i, "to": "a@b.c"})
        for i in range(n)
    ]


async def drive(
    items: Iterable[Any], work: Callable[[Any], Awaitable[object]], tasks: int
) -> float:
    """Seconds to run ``work`` on every item with ``tasks`` concurrent workers."""
    queue = list(items)
    position = 0

    async def worker() -> None:
        nonlocal position
        while position < len(queue):
            item = queue[position]
            position += 1
            await work(item)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return time.perf_counter() - started


# -- 1 and 2: fresh and replay throughput, beside the floor --------------------------------


async def throughput(
    ledger: EffectLedger,
    floor_fresh_call: Callable[[str], Awaitable[object]],
    floor_replay_call: Callable[[str], Awaitable[object]],
    sizes: Sizes,
    tasks: int,
    floor_single_call: Callable[[str], Awaitable[object]] | None = None,
) -> dict[str, Figure]:
    """calls/s for fresh runs and replays, ledger and floor, ``tasks`` at a time;
    with ``floor_single_call`` also that one-statement floor's ("floor_single", on
    keys of its own), driven right after the fresh floor."""
    results: dict[str, list[float]] = {
        "fresh": [],
        "replay": [],
        "floor_fresh": [],
        "floor_replay": [],
    }
    if floor_single_call is not None:
        results["floor_single"] = []

    async def measure(rep: int) -> float:
        run_id = uuid.uuid4().hex[:8]
        calls = calls_for(run_id, sizes.calls)
        keys = [f"{run_id}-{i:08d}".ljust(64, "0") for i in range(sizes.calls)]
        gc.collect()
        # Interleave ledger and floor so drift on a noisy machine hits both.
        fresh = await drive(calls, lambda c: ledger.run(c, handler), tasks)
        floor_fresh = await drive(keys, floor_fresh_call, tasks)
        if floor_single_call is not None:
            singles = [f"{run_id}-s{i:07d}".ljust(64, "0") for i in range(sizes.calls)]
            floor_single = await drive(singles, floor_single_call, tasks)
        replay = await drive(calls, lambda c: ledger.run(c, handler), tasks)
        floor_replay = await drive(keys, floor_replay_call, tasks)
        if rep >= 0:
            n = sizes.calls
            results["fresh"].append(n / fresh)
            results["floor_fresh"].append(n / floor_fresh)
            results["replay"].append(n / replay)
            results["floor_replay"].append(n / floor_replay)
            if floor_single_call is not None:
                results["floor_single"].append(n / floor_single)
        return fresh

    await repeat(sizes.repetitions, measure)
    return {name: figure(values, "calls/s") for name, values in results.items()}


# -- 2b: hot keys: 32 tasks replaying the same 10 keys ----------------------------------------

HOT_KEYS = 10


async def hot_keys(
    ledger: EffectLedger,
    floor_fresh_call: Callable[[str], Awaitable[object]],
    floor_replay_call: Callable[[str], Awaitable[object]],
    sizes: Sizes,
) -> dict[str, Figure]:
    """calls/s of ``CONCURRENCY`` tasks replaying the same ``HOT_KEYS`` finished keys,
    ledger and floor (the floor reads the same 10 rows of its own table)."""
    results: dict[str, list[float]] = {"replay": [], "floor_replay": []}

    async def measure(rep: int) -> float:
        run_id = uuid.uuid4().hex[:8]
        hot = calls_for(run_id, HOT_KEYS)
        keys = [f"{run_id}-{i:08d}".ljust(64, "0") for i in range(HOT_KEYS)]
        for call in hot:
            await ledger.run(call, handler)
        for key in keys:
            await floor_fresh_call(key)
        gc.collect()
        replay = await drive(
            (hot[i % HOT_KEYS] for i in range(sizes.calls)),
            lambda c: ledger.run(c, handler),
            CONCURRENCY,
        )
        floor = await drive(
            (keys[i % HOT_KEYS] for i in range(sizes.calls)), floor_replay_call, CONCURRENCY
        )
        if rep >= 0:
            results["replay"].append(sizes.calls / replay)
            results["floor_replay"].append(sizes.calls / floor)
        return replay

    await repeat(sizes.repetitions, measure)
    return {name: figure(values, "calls/s") for name, values in results.items()}


# -- 3: contention: 50 callers, one key, a 100 ms handler -------------------------------------


async def contended(ledger: EffectLedger, sizes: Sizes) -> dict[str, Any]:
    delays: list[float] = []
    executions: list[int] = []

    async def measure(rep: int) -> float:
        call = ToolCall(workflow_id="bench-contended", tool="slow", args={"run": uuid.uuid4().hex})
        ran: list[asyncio.Task[Any] | None] = []

        async def slow(effect: object) -> str:
            ran.append(asyncio.current_task())
            await asyncio.sleep(0.1)
            return "done"

        returned: dict[asyncio.Task[Any], float] = {}

        async def caller() -> None:
            await ledger.run(call, slow)
            task = asyncio.current_task()
            assert task is not None
            returned[task] = time.perf_counter()

        await asyncio.gather(*(caller() for _ in range(sizes.contended_tasks)))
        winner = ran[0]
        assert winner is not None
        if rep >= 0:
            executions.append(len(ran))
            won_at = returned[winner]
            delays.extend(
                (at - won_at) * 1000 for task, at in returned.items() if task is not winner
            )
        return 0.0

    await repeat(sizes.repetitions, measure)
    return {
        "executions_max": max(executions),
        "wake_ms": figure(delays, "ms"),
        "wake_max_ms": max(delays),
    }


# -- 4: approval wake ----------------------------------------------------------------------


async def approval_wake(
    ledger: EffectLedger, sizes: Sizes, approve: Callable[[str], Awaitable[float]]
) -> Figure:
    """ms from approve() returning (``approve`` gives that time) to run() returning."""
    delays: list[float] = []
    for _ in range(sizes.approval_trials):
        call = ToolCall(workflow_id="bench-approval", tool="deploy", args={"run": uuid.uuid4().hex})
        key = ledger.idem_key(call)
        waiting = asyncio.create_task(ledger.run(call, handler, RunOptions(requires_approval=True)))
        while True:
            effect = await ledger.find_by_idem_key(key)
            if effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)  # let the waiter settle into its wait
        approved_at = await approve(key)
        await waiting
        delays.append((time.time() - approved_at) * 1000)
    return figure(delays, "ms")


class ApproverProcess:
    """A second process that approves keys it reads from stdin and prints when it did."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.approver", url],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.process.stdout.readline()  # "ready"

    async def approve(self, key: str) -> float:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(key + "\n")
        self.process.stdin.flush()
        line = await asyncio.to_thread(self.process.stdout.readline)
        return float(line)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


# -- 6: scaling across processes (Postgres) ----------------------------------------------------


def scaling(url: str, processes: int, calls_each: int) -> float:
    """Total fresh calls/s with ``processes`` worker processes on one database."""
    start_at = time.time() + 2.0 + 0.3 * processes
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", url, str(calls_each), str(start_at)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    ends = []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        lines = out.strip().splitlines()
        if worker.returncode != 0 or not lines:
            raise RuntimeError(
                f"scaling worker exited {worker.returncode} without a result; its stderr:\n{err}"
            )
        ends.append(float(lines[-1]))
    return processes * calls_each / (max(ends) - start_at)


# -- 7: begin latency against table size ------------------------------------------------------


async def begin_latency(store: Store, samples: int) -> Figure:
    """Latency of fresh begins (one insert-or-get each) at the current table size."""
    values: list[float] = []
    run_id = uuid.uuid4().hex[:8]
    for i in range(samples):
        new = NewEffect(
            idem_key=f"{run_id}{i:056d}",
            workflow_id="bench-size",
            call_id=None,
            tool="bench.size",
            args_canonical="{}",
            resource_id_canonical=None,
        )
        started = time.perf_counter()
        await store.begin(new)
        values.append((time.perf_counter() - started) * 1e6)
    return figure(values, "us")


# -- 8: memory per effect (MemoryStore) ---------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def memory_growth(sizes: Sizes) -> float:
    """RSS growth in MB per 100k effects kept by MemoryStore."""
    ledger = build_ledger(MemoryStore())
    calls = calls_for("rss", sizes.rss_effects)
    gc.collect()
    before = rss_bytes()
    for call in calls:
        await ledger.run(call, handler)
    del calls
    gc.collect()
    grown = rss_bytes() - before
    return grown / 1e6 * (100_000 / sizes.rss_effects)


async def memory_overhead_us(sizes: Sizes) -> Figure:
    """Per-call cost of a fresh MemoryStore run over awaiting the handler directly."""
    values: list[float] = []

    async def measure(rep: int) -> float:
        ledger = build_ledger(MemoryStore())
        calls = calls_for(uuid.uuid4().hex[:8], sizes.calls * 5)
        gc.collect()
        started = time.perf_counter()
        for call in calls:
            await handler(call)
        direct = time.perf_counter() - started
        started = time.perf_counter()
        for call in calls:
            await ledger.run(call, handler)
        fresh = time.perf_counter() - started
        if rep >= 0:
            values.append((fresh - direct) / len(calls) * 1e6)
        return fresh

    await repeat(sizes.repetitions, measure)
    return figure(values, "us")


# -- 9: the @ledger.tool wrapper over a hand-written run() (MemoryStore) ------------------------


async def tool_overhead_us(sizes: Sizes) -> dict[str, Figure]:
    """Per-call cost of a decorated tool over ``ledger.run()``, fresh and replayed.

    The run() side builds its ``ToolCall`` per call, as a caller of run()
    must; each side has its own MemoryStore. The difference is a few percent
    of a call, under a shared machine's noise, which only ever adds time:
    so the two sides alternate in short rounds (which goes first alternates
    too) and each repetition compares the fastest round of each side (a
    median of per-round differences swung by ±5 µs on a busy machine).
    """
    results: dict[str, list[float]] = {"fresh": [], "replay": []}
    rounds, chunk = 20, max(sizes.calls // 4, 50)

    async def measure(rep: int) -> float:
        workflow_id = f"bench-{uuid.uuid4().hex[:8]}"
        by_run, by_tool = build_ledger(MemoryStore()), build_ledger(MemoryStore())

        @by_tool.tool("bench.tool")
        async def tool(i: int, to: str) -> dict[str, bool]:
            return {"ok": True}

        async def runs(first: int) -> float:
            started = time.perf_counter()
            for i in range(first, first + chunk):
                call = ToolCall(
                    workflow_id=workflow_id, tool="bench.tool", args={"i": i, "to": "a@b.c"}
                )
                await by_run.run(call, handler)
            return time.perf_counter() - started

        async def tools(first: int) -> float:
            started = time.perf_counter()
            async with by_tool.workflow(workflow_id):
                for i in range(first, first + chunk):
                    await tool(i, to="a@b.c")
            return time.perf_counter() - started

        gc.collect()
        fastest = {(kind, side): float("inf") for kind in results for side in ("tool", "run")}
        for r in range(rounds):
            for kind in ("fresh", "replay"):
                first = r * chunk  # a replay repeats the round's fresh calls
                if r % 2:
                    tool_s, run_s = await tools(first), await runs(first)
                else:
                    run_s, tool_s = await runs(first), await tools(first)
                fastest[kind, "tool"] = min(fastest[kind, "tool"], tool_s)
                fastest[kind, "run"] = min(fastest[kind, "run"], run_s)
        if rep >= 0:
            for kind, values in results.items():
                values.append((fastest[kind, "tool"] - fastest[kind, "run"]) / chunk * 1e6)
        return 0.0

    await repeat(sizes.repetitions, measure)
    return {kind: figure(values, "us") for kind, values in results.items()}


def ratio(ledger: Figure, floor: Figure) -> float:
    return ledger.median / floor.median


__all__ = [
    "CONCURRENCY",
    "ApproverProcess",
    "Sizes",
    "approval_wake",
    "begin_latency",
    "contended",
    "memory_growth",
    "memory_overhead_us",
    "percentile",
    "ratio",
    "scaling",
    "throughput",
    "tool_overhead_us",
]
