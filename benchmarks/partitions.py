"""The partitioned effects table against the plain one, side by side (PostgreSQL).

    python -m benchmarks.partitions --period month            # step latency, interleaved
    python -m benchmarks.partitions --period week --purge 300000

On a shared server, figures taken minutes apart do not compare; these are
taken under the same load. Two schemas of their own (dropped at the end),
a plain ledger and one partitioned by ``--period``, each filled with
``--effects`` finished effects over 100 days (``generate_series``, with the
partitions those days need). Then ``--rounds`` rounds alternate between the
two: a fresh ``begin``, its ``commit``, and the ``begin`` of an existing key
by a store that has not seen it (a replay). Medians in microseconds. With
``--purge N``, each table is instead filled with N effects and purged of
the ones older than 90 days, plain and partitioned in turn, twice.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import NewEffect
from agent_ledger.stores.postgres import PostgresStore
from benchmarks.retention import DAYS, _fill

SCHEMA = "agent_ledger_bench_partitions"


async def _table(dsn: str, schema: str, period: str | None, effects: int) -> PostgresStore:
    """A store on a fresh schema holding ``effects`` generated effects."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    store = await PostgresStore.connect(dsn, schema=schema, max_size=2)
    await store.create_schema()
    with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
        if period is not None:
            await store.partition(period=period)
            conn.execute(
                "SELECT agent_ledger_add_partitions(NULL,"
                f" clock_timestamp() - interval '{DAYS + 1} days')"
            )
        conn.execute(_fill(0, effects, partitioned=period is not None).encode())
        conn.execute("VACUUM ANALYZE")
    return store


def _drop(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def steps(dsn: str, period: str, effects: int, rounds: int) -> dict[str, dict[str, int]]:
    """Median begin, commit and replay (us) per table, rounds interleaved."""
    stores = {
        "plain": await _table(dsn, SCHEMA + "_plain", None, effects),
        "partitioned": await _table(dsn, SCHEMA + "_part", period, effects),
    }
    spent: dict[str, dict[str, list[float]]] = {
        name: {"begin": [], "commit": [], "replay": []} for name in stores
    }
    try:
        for i in range(rounds):
            for name, store in stores.items():
                times = spent[name]
                started = time.perf_counter()
                fresh = await store.begin(
                    NewEffect(uuid.uuid4().hex * 2, "bench", None, "bench", "{}", None)
                )
                times["begin"].append(time.perf_counter() - started)
                started = time.perf_counter()
                await store.commit(
                    fresh.effect.id, attempt=fresh.effect.attempt,
                    status=EffectStatus.SUCCEEDED, result_json="1", error=None,
                )  # fmt: skip
                times["commit"].append(time.perf_counter() - started)
                j = (i * 7919) % effects
                key = hashlib.md5(str(j).encode()).hexdigest()
                key += hashlib.md5(str(-j).encode()).hexdigest()
                started = time.perf_counter()
                replay = await store.begin(NewEffect(key, "bench", None, "bench", "{}", None))
                times["replay"].append(time.perf_counter() - started)
                assert not replay.created, "a generated key must be found"
    finally:
        for store in stores.values():
            await store.close()
        _drop(dsn, SCHEMA + "_plain")
        _drop(dsn, SCHEMA + "_part")
    return {
        name: {step: round(statistics.median(v) * 1e6) for step, v in times.items()}
        for name, times in spent.items()
    }


async def purges(dsn: str, period: str, effects: int) -> list[dict[str, Any]]:
    """Purge of the effects older than 90 days, plain and partitioned in turn, twice."""
    rows: list[dict[str, Any]] = []
    for table in (None, period, None, period):
        schema = SCHEMA + ("_part" if table else "_plain")
        store = await _table(dsn, schema, table, effects)
        try:
            started = time.perf_counter()
            purged = await store.purge(
                older_than=timedelta(days=DAYS - 10),
                statuses=frozenset({EffectStatus.SUCCEEDED}),
            )
            rows.append(
                {
                    "table": f"partitioned by {table}" if table else "plain",
                    "effects": effects,
                    "purged": purged,
                    "purge_s": round(time.perf_counter() - started, 2),
                }
            )
            print(rows[-1], flush=True)
        finally:
            await store.close()
            _drop(dsn, schema)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.partitions")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--period", choices=["day", "week", "month"], default="month")
    parser.add_argument("--effects", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--purge", type=int, default=0, metavar="N", help="compare purges of N")
    args = parser.parse_args(argv)
    if args.purge:
        asyncio.run(purges(args.dsn, args.period, args.purge))
    else:
        print(asyncio.run(steps(args.dsn, args.period, args.effects, args.rounds)))


if __name__ == "__main__":
    main()
