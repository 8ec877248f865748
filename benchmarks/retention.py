"""Begin and replay latency, purge time and table size at 10k, 1M and 10M effects (PostgreSQL).

    python -m benchmarks.retention --dsn postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.retention --sizes 10000,1000000   # skip the long 10M step
    python -m benchmarks.retention --variant partitioned --period day   # or --variant both

The effects are generated in the database with ``generate_series``, not run
through the ledger (10M runs would take hours): finished effects, each with
its own key, spread evenly over the last 100 days, in a schema of their own
(``agent_ledger_bench_retention``, dropped at the end). At each size the
table is grown to that many rows and analyzed, then measured:

* ``begin`` of a fresh key (the insert-or-get), and of an existing finished
  key picked at random from the whole table (a replay, as another worker
  sees it: this store has not begun it, so it is not in its cache);
* ``commit`` of each fresh key's effect (a statement by id: on the
  partitioned table it visits every partition's primary key);
* table and index sizes, per million effects;
* ``purge`` of the oldest tenth (older than 90 days), timed: one ``DELETE``
  on the plain table; on the partitioned one (``--variant partitioned``,
  postgres_partitioned.sql, one partition per ``--period``, made for the
  100 days before the fill) whole partitions detached and dropped, and a
  ``DELETE`` only in the partition the cut-off falls in. The tenth is put
  back before the next size.

It prints a Markdown table (benchmarks/README.md keeps the last run's).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any, Final

from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import NewEffect
from agent_ledger.stores.postgres import PostgresStore

SCHEMA = "agent_ledger_bench_retention"
DEFAULT_SIZES = (10_000, 1_000_000, 10_000_000)
#: The generated effects' ages are spread over this many days.
DAYS = 100
#: Rows per INSERT while filling (one transaction each).
CHUNK = 1_000_000


def _fill(start: int, stop: int, *, partitioned: bool = False, where: str = "") -> str:
    """Effects start..stop-1: finished, keyed md5(i)||md5(-i), aged by i over DAYS days.

    On the partitioned table each effect's key row is inserted with it.
    """
    insert = (
        "INSERT INTO agent_ledger_effects (idem_key, workflow_id, tool, status,"
        " args_canonical, result, attempt, executions, created_at, updated_at,"
        " heartbeat_at, completed_at, started_at)"
        " SELECT md5(i::text) || md5((-i)::text), 'wf-' || (i % 100000), 'tool-' || (i % 20),"
        " 'succeeded', '{\"i\":' || i || '}', '{\"ok\":true}', 1, 1, t, t, t, t, t"
        f" FROM generate_series({start}, {stop - 1}) AS i,"
        f" LATERAL (SELECT clock_timestamp() - (i % {DAYS}) * interval '1 day'"
        f" - (i % 86400) * interval '1 second' AS t) AS at {where}"
    )
    if not partitioned:
        return insert
    return (
        f"WITH e AS ({insert} RETURNING idem_key, id, created_at)"
        " INSERT INTO agent_ledger_effect_keys (idem_key, id, created_at)"
        " SELECT idem_key, id, created_at FROM e"
    )


def _key(i: int) -> str:
    import hashlib

    return hashlib.md5(str(i).encode()).hexdigest() + hashlib.md5(str(-i).encode()).hexdigest()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _begin_us(
    store: PostgresStore, keys: list[str], commits: list[float] | None = None
) -> list[float]:
    """Each key's begin, timed; with ``commits``, the fresh effect's commit too."""
    spent: list[float] = []
    for key in keys:
        new = NewEffect(key, "bench", None, "bench.retention", "{}", None)
        started = time.perf_counter()
        outcome = await store.begin(new)
        spent.append((time.perf_counter() - started) * 1e6)
        if commits is not None and outcome.created:
            started = time.perf_counter()
            await store.commit(
                outcome.effect.id, attempt=outcome.effect.attempt,
                status=EffectStatus.SUCCEEDED, result_json="1", error=None,
            )  # fmt: skip
            commits.append((time.perf_counter() - started) * 1e6)
    return spent


#: Table and index bytes of the effects (every partition) and of the key table.
_SIZES: Final = (
    "SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint,"
    " coalesce(sum(pg_indexes_size(relid)), 0)::bigint"
    " FROM (SELECT relid FROM pg_partition_tree('agent_ledger_effects') WHERE isleaf"
    # The plain table is no partition tree: itself (the parent's own sizes are 0).
    " UNION SELECT 'agent_ledger_effects'::regclass"
    " UNION SELECT to_regclass('agent_ledger_effect_keys')) AS t(relid)"
    " WHERE relid IS NOT NULL"
)


async def measure(
    dsn: str,
    sizes: tuple[int, ...],
    samples: int,
    schema: str = SCHEMA,
    *,
    partitioned: bool = False,
    period: str = "day",
) -> list[dict[str, Any]]:
    import psycopg
    from psycopg import sql

    rows: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    store = await PostgresStore.connect(dsn, schema=schema, max_size=2)
    try:
        await store.create_schema()
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
            if partitioned:
                await store.partition(period=period)
                # Partitions for the generated effects' 100 days too.
                conn.execute(
                    "SELECT agent_ledger_add_partitions(NULL,"
                    f" clock_timestamp() - interval '{DAYS + 1} days')"
                )
            have = 0
            for size in sizes:
                filled_at = time.perf_counter()
                for start in range(have, size, CHUNK):
                    stop = min(size, start + CHUNK)
                    conn.execute(_fill(start, stop, partitioned=partitioned).encode())
                fill_s = time.perf_counter() - filled_at
                have = size
                conn.execute("VACUUM ANALYZE agent_ledger_effects")
                if partitioned:
                    conn.execute("VACUUM ANALYZE agent_ledger_effect_keys")
                rng = random.Random(size)
                fresh = [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(samples)]
                existing = [_key(rng.randrange(size)) for _ in range(samples)]
                commit_us: list[float] = []
                fresh_us = await _begin_us(store, fresh, commit_us)
                replay_us = await _begin_us(store, existing)
                # Leave exactly `size` generated rows.
                conn.execute("DELETE FROM agent_ledger_effects WHERE idem_key = ANY(%s)", (fresh,))
                if partitioned:
                    conn.execute(
                        "DELETE FROM agent_ledger_effect_keys WHERE idem_key = ANY(%s)", (fresh,)
                    )
                partitions = conn.execute(
                    "SELECT count(*) FROM pg_partition_tree('agent_ledger_effects') WHERE isleaf"
                ).fetchone() or (0,)
                table_b, index_b = conn.execute(_SIZES).fetchone() or (0, 0)
                purged_at = time.perf_counter()
                purged = await store.purge(
                    older_than=timedelta(days=DAYS - 10),
                    statuses=frozenset({EffectStatus.SUCCEEDED}),
                )
                purge_s = time.perf_counter() - purged_at
                # Put the purged tenth back, for the next size (and the
                # partitions it had, which the purge dropped).
                if partitioned:
                    conn.execute(
                        "SELECT agent_ledger_add_partitions(NULL,"
                        f" clock_timestamp() - interval '{DAYS + 1} days')"
                    )
                for start in range(0, size, CHUNK):
                    stop = min(size, start + CHUNK)
                    where = f"WHERE i % {DAYS} >= {DAYS - 10}"
                    conn.execute(_fill(start, stop, partitioned=partitioned, where=where).encode())
                conn.execute("VACUUM ANALYZE agent_ledger_effects")
                millions = size / 1e6
                rows.append(
                    {
                        "variant": f"partitioned by {period}" if partitioned else "plain",
                        "partitions": int(partitions[0]),
                        "effects": size,
                        "fill_s": round(fill_s, 1),
                        "begin_p50_us": round(statistics.median(fresh_us)),
                        "begin_p95_us": round(_p(fresh_us, 0.95)),
                        "commit_p50_us": round(statistics.median(commit_us)),
                        "commit_p95_us": round(_p(commit_us, 0.95)),
                        "replay_p50_us": round(statistics.median(replay_us)),
                        "replay_p95_us": round(_p(replay_us, 0.95)),
                        "purged": purged,
                        "purge_s": round(purge_s, 2),
                        "table_mb_per_million": round(table_b / 2**20 / millions),
                        "indexes_mb_per_million": round(index_b / 2**20 / millions),
                    }
                )
                print(rows[-1], flush=True)
    finally:
        await store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| table | effects | begin p50 / p95 (us) | commit p50 / p95 (us) "
        "| replay p50 / p95 (us) | purge of the oldest tenth "
        "| table MB per million | indexes MB per million |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    return head + "".join(
        f"| {r['variant']} ({r['partitions']} partitions) " * (r["partitions"] > 0)
        + f"| {r['variant']} " * (r["partitions"] == 0)
        + f"| {r['effects']:,} | {r['begin_p50_us']} / {r['begin_p95_us']} "
        f"| {r['commit_p50_us']} / {r['commit_p95_us']} "
        f"| {r['replay_p50_us']} / {r['replay_p95_us']} "
        f"| {r['purged']:,} rows in {r['purge_s']} s "
        f"| {r['table_mb_per_million']} | {r['indexes_mb_per_million']} |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retention")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--variant", choices=["plain", "partitioned", "both"], default="plain")
    parser.add_argument("--period", choices=["day", "week", "month"], default="day")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    rows: list[dict[str, Any]] = []
    for partitioned in {"plain": (False,), "partitioned": (True,), "both": (False, True)}[
        args.variant
    ]:
        rows += asyncio.run(
            measure(args.dsn, sizes, args.samples, partitioned=partitioned, period=args.period)
        )
    print(markdown(rows))


if __name__ == "__main__":
    main()
