"""Instructions per call, counted by callgrind: `python -m benchmarks.instructions`.

Wall-clock figures on a shared 2-core machine move with whatever else runs;
an instruction count does not. Each scenario runs in a fresh interpreter
under ``valgrind --tool=callgrind`` three times, with the same set-up and
warm-up and then:

- O: nothing more;
- A: the N ``ToolCall`` objects the next phases run built, nothing more;
- B: those N calls run fresh (``run()``);
- C: the same N fresh calls, then the N calls again (replays).

so ``(B - A) / N`` is the cost of a fresh ``run()`` and ``(C - B) / N`` that
of a replay, with the interpreter's start-up, the imports and the warm-up
subtracted away; ``(A - O) / N`` is what building a ``ToolCall`` costs the
caller (never part of the fresh figure: phase A builds the same calls). Objects
allocated before the measured calls are frozen out of the garbage
collector's sight (``gc.freeze()``), so a full collection of the
interpreter's own start-up objects does not land in one phase's count.
``PYTHONHASHSEED`` is fixed, so two runs of one build give the same count
(to well under 0.1 %); one repetition is enough, which is why this mode has
none.

The figures include the handler (``return {"ok": True}``) and, on SQLite,
the SQLite library's own work and the thread hand-off: what a caller pays.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Calls per measured phase. Large enough that the per-call figure is stable
#: to a few instructions, small enough that a run under callgrind (about 50x
#: slower than native) takes seconds.
CALLS = {"memory": 2000, "sqlite": 400}

#: Calls made before measuring, in every phase alike: the first calls pay for
#: lazy imports, caches and the store's first statements.
WARM_UP = 50


@dataclass(frozen=True)
class Counts:
    store: str
    calls: int
    fresh: float
    replay: float
    #: Building one ``ToolCall`` (the caller's, before ``run()``).
    tool_call: float

    def as_dict(self) -> dict[str, object]:
        return {
            "store": self.store,
            "calls": self.calls,
            "fresh": self.fresh,
            "replay": self.replay,
            "tool_call": self.tool_call,
        }


async def _drive(store_kind: str, phase: str, calls: int, folder: str) -> None:
    from agent_ledger import MemoryStore, SqliteStore, ToolCall
    from agent_ledger.testing import build_ledger

    async def handler(effect: object) -> dict[str, bool]:
        return {"ok": True}

    if store_kind == "memory":
        store: MemoryStore | SqliteStore = MemoryStore()
    else:
        store = SqliteStore(os.path.join(folder, "ledger.db"))
    ledger = build_ledger(store)
    try:
        for i in range(WARM_UP):
            call = ToolCall(workflow_id="bench", tool="warm", args={"i": i})
            await ledger.run(call, handler)
            await ledger.run(call, handler)
        measured = (
            []
            if phase == "O"
            else [
                ToolCall(workflow_id="bench", tool="bench.tool", args={"i": i, "to": "a@b.c"})
                for i in range(calls)
            ]
        )
        # Out of the collector's sight from here: what was allocated before the
        # measured calls (the imports, the warm-up, the calls' list). A full
        # collection of those costs tens of millions of instructions and falls
        # in one phase or another depending on allocation counts, a jump of
        # thousands per call between two builds that differ by a few objects.
        gc.freeze()
        if phase in ("B", "C"):
            for call in measured:
                await ledger.run(call, handler)
        if phase == "C":
            for call in measured:
                await ledger.run(call, handler)
    finally:
        await store.close()


def _count(store_kind: str, phase: str, calls: int) -> int:
    """Instructions of one interpreter running one phase, under callgrind."""
    with tempfile.TemporaryDirectory(prefix="agent-ledger-instr-") as folder:
        out = os.path.join(folder, "callgrind.out")
        env = dict(os.environ, PYTHONHASHSEED="0")
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--drive",
            store_kind,
            phase,
            str(calls),
            folder,
        ]
        subprocess.run(command, check=True, env=env, capture_output=True)
        return _total(Path(out).read_text())


def _total(profile: str) -> int:
    """The program's total from a callgrind output file (its `summary:` line)."""
    found = re.search(r"^(?:summary|totals):\s*(\d+)", profile, re.MULTILINE)
    if found is None:
        raise RuntimeError("callgrind wrote no summary line; is this valgrind 3.x?")
    return int(found.group(1))


def measure(store_kind: str, calls: int) -> Counts:
    o, a, b, c = (_count(store_kind, phase, calls) for phase in "OABC")
    return Counts(
        store_kind,
        calls,
        fresh=(b - a) / calls,
        replay=(c - b) / calls,
        tool_call=(a - o) / calls,
    )


#: The issue's targets, in instructions per call (MemoryStore).
TARGETS = {("memory", "fresh"): 120_000, ("memory", "replay"): 80_000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    parser.add_argument("--store", choices=["memory", "sqlite", "all"], default="all")
    parser.add_argument(
        "--calls", type=int, default=None, help="calls per phase (default: per store)"
    )
    parser.add_argument("--output", type=Path, default=None, help="write the counts as JSON here")
    parser.add_argument(
        "--drive", nargs=4, metavar=("STORE", "PHASE", "CALLS", "FOLDER"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.drive:
        store_kind, phase, calls, folder = args.drive
        asyncio.run(_drive(store_kind, phase, int(calls), folder))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    kinds = ["memory", "sqlite"] if args.store == "all" else [args.store]
    results = []
    print(
        f"{'store':8} {'calls':>6} {'fresh (instr/call)':>20} {'replay (instr/call)':>20}"
        f" {'ToolCall (instr)':>17}"
    )
    for kind in kinds:
        counts = measure(kind, args.calls or CALLS[kind])
        results.append(counts)
        marks = []
        for what in ("fresh", "replay"):
            target = TARGETS.get((kind, what))
            value = getattr(counts, what)
            marks.append(
                f"{value:>14,.0f}"
                + ("" if target is None else f" {'ok' if value <= target else 'MISSED'}")
            )
        print(
            f"{kind:8} {counts.calls:>6} {marks[0]:>20} {marks[1]:>20} {counts.tool_call:>17,.0f}"
        )
    if args.output is not None:
        args.output.write_text(json.dumps([c.as_dict() for c in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
