"""The benchmark suite still runs end to end (quick mode). Timings are not asserted:
performance goals live in benchmarks/, never in tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.harness import DSN, require_mysql, require_postgres

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.every_store  # the tiers are chosen here, per store:
@pytest.mark.parametrize(
    "store",
    [
        # The slow tier, as every benchmark run: seconds on the memory store, a
        # minute or two each on the stores with a server or a file.
        pytest.param("memory", marks=pytest.mark.slow),
        pytest.param("sqlite", marks=pytest.mark.slow),
        pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.slow]),
        pytest.param("mysql", marks=[pytest.mark.mysql, pytest.mark.slow]),
    ],
)
def test_benchmark_suite_runs_and_writes_results(store: str, tmp_path: Path) -> None:
    """`python -m benchmarks --quick` prints a table and writes a JSON report per store."""
    if store == "postgres":
        require_postgres()
    if store == "mysql":
        require_mysql()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--store", store, "--quick", "--dsn", DSN,
         "--output", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"== {store} ==" in done.stdout
    [report] = list(tmp_path.glob(f"*-{store}.json"))
    payload = orjson.loads(report.read_bytes())
    assert payload["store"] == store and payload["machine"]["cores"]
    rows = {row["what"]: row for row in payload["rows"]}
    fresh = rows["fresh run, sequential"]
    assert fresh["ledger"]["samples"] >= 5 and fresh["ledger"]["median"] > 0
    assert rows["contended: executions of 50 callers"]["ledger"] == 1
    if store != "memory":
        assert fresh["ratio"] > 0 and "floor" in fresh
    if store == "mysql":
        # Not a timing: the server's own count of statements (others' traffic aside).
        assert round(rows["statements per fresh run (server's count)"]["ledger"]) == 2
        assert round(rows["statements per replay (server's count)"]["ledger"]) == 1
    if store == "postgres":
        assert rows["statements per fresh run (counted)"]["ledger"] == 2
        assert rows["statements per replay (counted)"]["ledger"] == 1
        # Not a timing: begin's statement gets no transaction id for a finished effect.
        assert rows["transaction ids given to replays (caller's path)"]["ledger"] == 0
        assert rows["WAL bytes per replay, caller's path (EXPLAIN)"]["ledger"] >= 0
        hot = rows["replay run, 32 tasks on 10 hot keys"]
        assert hot["ratio"] > 0 and hot["floor"]["samples"] >= 5
        single = rows["fresh run, sequential, vs one insert-or-read"]
        assert single["ratio"] > 0 and single["floor"]["samples"] >= 5


def test_the_instruction_count_is_read_from_callgrinds_summary_line() -> None:
    from benchmarks.instructions import _total

    profile = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 123456789\ntotals: 1\n"
    assert _total(profile) == 123456789
    with pytest.raises(RuntimeError, match="no summary line"):
        _total("events: Ir\n")


@pytest.mark.slow
def test_instruction_counts_come_out_positive_and_repeatable(tmp_path: Path) -> None:
    """Two runs of the same build count the same instructions per call (within 1 %):
    the point of measuring in instructions on a noisy machine."""
    import shutil

    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (.ci/run installs it)")
    from benchmarks.instructions import measure

    first, second = measure("memory", 40), measure("memory", 40)
    assert first.fresh > first.replay > 0
    assert abs(first.fresh - second.fresh) <= 0.01 * first.fresh
    assert abs(first.replay - second.replay) <= 0.01 * first.replay
