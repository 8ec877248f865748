"""The retention benchmark (benchmarks/retention.py) runs, on a small table.

It measures; this checks that what it measures is what it says: the table
holds the generated effects, the purge removes the oldest tenth, and a
replay of a generated key finds it (it creates nothing). Timings are not
asserted.
"""

from __future__ import annotations

import uuid

import pytest

from benchmarks.retention import markdown, measure

# Benchmark smoke runs, like every benchmark run (tests/test_benchmarks.py): the
# slow tier. The partitioned one keeps the server busy 5 to 15 s making a
# hundred daily partitions; the purges they measure are pinned in the fast tier
# by tests/contract/ and tests/postgres/test_partitioned_effects.py.
pytestmark = pytest.mark.slow


async def test_the_retention_benchmark_fills_measures_and_purges_a_tenth(dsn: str) -> None:
    schema = f"agent_ledger_bench_test_{uuid.uuid4().hex[:8]}"
    rows = await measure(dsn, (2_000, 5_000), samples=20, schema=schema)
    assert [r["effects"] for r in rows] == [2_000, 5_000]
    assert [r["purged"] for r in rows] == [200, 500]
    assert all(r["table_mb_per_million"] > 0 and r["indexes_mb_per_million"] > 0 for r in rows)
    assert "| 5,000 |" in markdown(rows)


async def test_the_benchmark_on_the_partitioned_table_drops_partitions(dsn: str) -> None:
    """The partitioned variant: the same effects, their key rows, and the tenth
    purged (mostly by dropping partitions, which the count cannot tell apart)."""
    schema = f"agent_ledger_bench_test_{uuid.uuid4().hex[:8]}"
    rows = await measure(dsn, (2_000,), samples=20, schema=schema, partitioned=True)
    assert [(r["effects"], r["purged"]) for r in rows] == [(2_000, 200)]
    # 100 days of daily partitions and the ones ahead, less the 10 purged.
    assert rows[0]["partitions"] > 100
    assert rows[0]["variant"] == "partitioned by day"
    assert "| partitioned by day (" in markdown(rows)


async def test_the_side_by_side_benchmark_times_both_tables_on_the_same_effects(dsn: str) -> None:
    """benchmarks/partitions.py: both tables answer every step (a generated key is
    found by a replay), and both purges remove the same tenth."""
    from benchmarks.partitions import purges, steps

    medians = await steps(dsn, "week", effects=500, rounds=3)
    assert set(medians) == {"plain", "partitioned"}
    assert all(set(m) == {"begin", "commit", "replay"} for m in medians.values())
    rows = await purges(dsn, "week", effects=1_000)
    assert [(r["table"], r["purged"]) for r in rows] == [
        ("plain", 100),
        ("partitioned by week", 100),
        ("plain", 100),
        ("partitioned by week", 100),
    ]
