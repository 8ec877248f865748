"""`python -m benchmarks [--store memory|sqlite|postgres|mysql|all] [--quick] [...]`.

Prints one table per store (each ledger figure beside its floor, measured in
the same run) and writes benchmarks/results/<date>-<store>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from agent_ledger import MemoryStore, SqliteStore, ToolCall
from agent_ledger.testing import StatementCounter, build_ledger
from benchmarks import scenarios as sc
from benchmarks.floors import MySQLFloor, PostgresFloor, SqliteFloor, handler
from benchmarks.timing import Figure, figure

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_DSN = os.environ.get("AGENT_LEDGER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test")
DEFAULT_MYSQL_URL = os.environ.get(
    "AGENT_LEDGER_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"
)


class Report:
    """Rows of (what, ledger, floor, ratio, target, met) and the raw figures."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        what: str,
        value: Figure | float | int,
        *,
        floor: Figure | None = None,
        target: str = "",
        met: bool | None = None,
    ) -> None:
        row: dict[str, Any] = {"what": what, "target": target, "met": met}
        row["ledger"] = value.as_dict() if isinstance(value, Figure) else value
        if floor is not None and isinstance(value, Figure):
            row["floor"] = floor.as_dict()
            row["ratio"] = value.median / floor.median
        self.rows.append(row)

    def print(self) -> None:
        print(f"\n== {self.store} ==")
        header = f"{'scenario':44} {'ledger':>22} {'floor':>14} {'ratio':>6}  target"
        print(header)
        print("-" * len(header))
        for row in self.rows:
            value = row["ledger"]
            if isinstance(value, dict):
                shown = f"{_num(value['median'])} (p95 {_num(value['p95'])}) {value['unit']}"
            else:
                shown = _num(value)
            floor = _num(row["floor"]["median"]) if "floor" in row else ""
            ratio = f"{row['ratio']:.2f}" if "ratio" in row else ""
            mark = {True: "ok", False: "MISSED", None: ""}[row["met"]]
            print(f"{row['what']:44} {shown:>22} {floor:>14} {ratio:>6}  {row['target']} {mark}")


def _num(value: float) -> str:
    if isinstance(value, int) or value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def throughput_rows(
    report: Report,
    label: str,
    figures: dict[str, Figure],
    target: float | None,
    replay_target: float | None = None,
) -> None:
    """Fresh runs against ``target`` x their floor, replays against ``replay_target``
    (by default the same) x theirs."""
    targets = {"fresh": target, "replay": target if replay_target is None else replay_target}
    for kind in ("fresh", "replay"):
        ledger, floor = figures[kind], figures[f"floor_{kind}"]
        target = targets[kind]
        ok = None if target is None else ledger.median / floor.median >= target
        report.add(
            f"{kind} run, {label}",
            ledger,
            floor=floor,
            target=f">= {target} x floor" if target else "",
            met=ok,
        )


def table_size_rows(report: Report, sizes: tuple[int, int], small: Figure, large: Figure) -> None:
    report.add(f"begin latency at {sizes[0]:,} effects", small)
    report.add(
        f"begin latency at {sizes[1]:,} effects",
        large,
        target="p50 <= 1.5 x smaller table",
        met=large.median <= 1.5 * small.median,
    )


async def in_process_approver(ledger: Any) -> Any:
    async def approve(key: str) -> float:
        await ledger.approve(key)
        return time.time()

    return approve


# -- per store ---------------------------------------------------------------------------


async def bench_memory(sizes: sc.Sizes) -> Report:
    report = Report("memory")
    ledger = build_ledger(MemoryStore())

    async def direct(key: str) -> object:
        return await handler(key)

    for label, tasks in (("sequential", 1), (f"{sc.CONCURRENCY} tasks", sc.CONCURRENCY)):
        figures = await sc.throughput(ledger, direct, direct, sizes, tasks)
        throughput_rows(report, label, figures, None)
    overhead = await sc.memory_overhead_us(sizes)
    report.add(
        "fresh run overhead over the bare handler",
        overhead,
        target="<= 15 us",
        met=overhead.median <= 15,
    )
    tool = await sc.tool_overhead_us(sizes)
    for kind in ("fresh", "replay"):
        report.add(
            f"@ledger.tool overhead over run(), {kind}",
            tool[kind],
            target="<= 3 us",
            met=tool[kind].median <= 3,
        )
    contention = await sc.contended(build_ledger(MemoryStore()), sizes)
    report.add(
        "contended: executions of 50 callers",
        contention["executions_max"],
        target="== 1",
        met=contention["executions_max"] == 1,
    )
    wake = contention["wake_ms"]
    report.add(
        "contended: winner commit -> waiter return", wake, target="<= 1 ms", met=wake.p95 <= 1.0
    )
    approval = await sc.approval_wake(ledger, sizes, await in_process_approver(ledger))
    report.add("approval wake, same process", approval)
    report.add("RSS growth per 100k effects (MB)", await sc.memory_growth(sizes))
    return report


async def bench_sqlite(sizes: sc.Sizes) -> Report:
    report = Report("sqlite")
    with tempfile.TemporaryDirectory(prefix="agent-ledger-bench-") as folder:
        store = SqliteStore(Path(folder) / "ledger.db")
        floor = SqliteFloor(Path(folder) / "floor.db")
        ledger = build_ledger(store)
        try:
            for label, tasks in (("sequential", 1), (f"{sc.CONCURRENCY} tasks", sc.CONCURRENCY)):
                figures = await sc.throughput(ledger, floor.fresh, floor.replay, sizes, tasks)
                throughput_rows(report, label, figures, 0.7, 0.8)
            contention = await sc.contended(ledger, sizes)
            report.add(
                "contended: executions of 50 callers",
                contention["executions_max"],
                target="== 1",
                met=contention["executions_max"] == 1,
            )
            report.add("contended: winner commit -> waiter return", contention["wake_ms"])
            approval = await sc.approval_wake(ledger, sizes, await in_process_approver(ledger))
            report.add("approval wake, same process", approval)
            approver = sc.ApproverProcess(f"sqlite:///{Path(folder) / 'ledger.db'}")
            try:
                approval = await sc.approval_wake(ledger, sizes, approver.approve)
            finally:
                approver.close()
            report.add("approval wake, other process (polling)", approval)
            small, large = sizes.table_sizes
            await _fill_sqlite(Path(folder) / "ledger.db", small)
            at_small = await sc.begin_latency(store, 500)
            await _fill_sqlite(Path(folder) / "ledger.db", large - small)
            at_large = await sc.begin_latency(store, 500)
            table_size_rows(report, sizes.table_sizes, at_small, at_large)
        finally:
            await store.close()
            floor.close()
    return report


async def _fill_sqlite(path: Path, rows: int) -> None:
    def fill() -> None:
        with sqlite3.connect(path) as conn:
            prefix = uuid.uuid4().hex[:8]
            conn.executemany(
                "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
                " args_canonical, result, created_us, updated_us, completed_us, heartbeat_us)"
                " VALUES (?, ?, 'filler', 'filler', 'succeeded', '{}', 'true', 0, 0, 0, 0)",
                ((f"{prefix}-{i}", f"{prefix}{i:056x}") for i in range(rows)),
            )

    await asyncio.to_thread(fill)


async def bench_postgres(sizes: sc.Sizes, dsn: str) -> Report:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool

    from agent_ledger.stores.postgres import PostgresStore

    report = Report("postgres")
    tag = uuid.uuid4().hex[:8]
    schema, floor_schema = f"agent_ledger_bench_{tag}", f"agent_ledger_floor_{tag}"
    pool = AsyncConnectionPool(
        dsn, min_size=4, max_size=sc.CONCURRENCY + 4, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    store = PostgresStore(pool, schema=schema)
    floor_store = PostgresStore(pool, schema=floor_schema)
    try:
        await store.create_schema()
        await floor_store.create_schema()
        floor = PostgresFloor(pool, f'"{floor_schema}".agent_ledger_effects')
        ledger = build_ledger(store)
        # Issue 32's targets: fresh runs 0.9 of the two-statement floor, replays 0.9
        # of the raw read sequentially and 0.8 with 32 tasks; and a fresh run at
        # least 0.45 of one insert-or-read per call (two durable statements
        # against one: about 0.5 is the ceiling).
        for label, tasks, replay_target in (
            ("sequential", 1, 0.9),
            (f"{sc.CONCURRENCY} tasks", sc.CONCURRENCY, 0.8),
        ):
            figures = await sc.throughput(
                ledger, floor.fresh, floor.replay, sizes, tasks, floor.insert_or_read
            )
            throughput_rows(report, label, figures, 0.9, replay_target)
            single = figures["floor_single"]
            report.add(
                f"fresh run, {label}, vs one insert-or-read",
                figures["fresh"],
                floor=single,
                target=">= 0.45 x floor",
                met=figures["fresh"].median / single.median >= 0.45,
            )
        hot = await sc.hot_keys(ledger, floor.fresh, floor.replay, sizes)
        report.add(
            f"replay run, {sc.CONCURRENCY} tasks on {sc.HOT_KEYS} hot keys",
            hot["replay"],
            floor=hot["floor_replay"],
            target=">= 0.7 x floor",
            met=hot["replay"].median / hot["floor_replay"].median >= 0.7,
        )
        await _wal_rows(report, dsn, store, ledger, floor, sizes)

        fresh_n, replay_n = await _statements(dsn, schema)
        report.add("statements per fresh run (counted)", fresh_n, target="== 2", met=fresh_n == 2)
        report.add("statements per replay (counted)", replay_n, target="== 1", met=replay_n == 1)

        contention = await sc.contended(ledger, sizes)
        report.add(
            "contended: executions of 50 callers",
            contention["executions_max"],
            target="== 1",
            met=contention["executions_max"] == 1,
        )
        wake = contention["wake_ms"]
        report.add(
            "contended: winner commit -> waiter return",
            wake,
            target="p50 <= 5, p95 <= 20 ms",
            met=wake.median <= 5 and wake.p95 <= 20,
        )
        approval = await sc.approval_wake(ledger, sizes, await in_process_approver(ledger))
        report.add(
            "approval wake, same process",
            approval,
            target="p50 <= 10 ms",
            met=approval.median <= 10,
        )
        approver = sc.ApproverProcess(f"{dsn}?schema={schema}")
        try:
            approval = await sc.approval_wake(ledger, sizes, approver.approve)
        finally:
            approver.close()
        report.add(
            "approval wake, other process",
            approval,
            target="p50 <= 10 ms",
            met=approval.median <= 10,
        )

        for processes in (1, 2, 4):
            rates = [
                await asyncio.to_thread(
                    sc.scaling, f"{dsn}?schema={schema}", processes, sizes.scaling_calls
                )
                for _ in range(sizes.repetitions)
            ]
            report.add(f"scaling: {processes} worker process(es)", figure(rates, "calls/s"))

        small, large = sizes.table_sizes
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            table = sql.Identifier(schema, "agent_ledger_effects")
            await conn.execute(sql.SQL("TRUNCATE {}").format(table))
            await _fill_postgres(conn, table, 0, small)
            at_small = await sc.begin_latency(store, 1_000)
            await _fill_postgres(conn, table, small, large)
            at_large = await sc.begin_latency(store, 1_000)
        table_size_rows(report, sizes.table_sizes, at_small, at_large)
    finally:
        await store.close()
        await floor_store.close()
        await pool.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in (schema, floor_schema):
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )
    return report


async def bench_mysql(sizes: sc.Sizes, url: str) -> Report:
    """MariaDB / MySQL: the ledger against raw asyncmy on an identical table, in a
    database of the run's own (dropped afterwards)."""
    from urllib.parse import urlsplit, urlunsplit

    from agent_ledger.stores.mysql import MySQLStore

    report = Report("mysql")
    database = f"agent_ledger_bench_{uuid.uuid4().hex[:8]}"
    admin = await MySQLStore.connect(url, max_size=1)
    async with admin._pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(f"CREATE DATABASE `{database}`")
    bench_url = urlunsplit(urlsplit(url)._replace(path="/" + database))
    store = await MySQLStore.connect(bench_url, max_size=sc.CONCURRENCY + 4)
    try:
        await store.create_schema()
        async with store._pool.connection() as conn, conn.cursor() as cur:
            await cur.execute("CREATE TABLE agent_ledger_floor LIKE agent_ledger_effects")
        floor = MySQLFloor(store._pool)
        ledger = build_ledger(store)
        for label, tasks in (("sequential", 1), (f"{sc.CONCURRENCY} tasks", sc.CONCURRENCY)):
            figures = await sc.throughput(ledger, floor.fresh, floor.replay, sizes, tasks)
            throughput_rows(report, label, figures, 0.7, 0.8)
        fresh_n, replay_n = await _mysql_statements(bench_url)
        report.add(
            "statements per fresh run (server's count)",
            fresh_n,
            target="== 2",
            met=round(fresh_n) == 2,
        )
        report.add(
            "statements per replay (server's count)",
            replay_n,
            target="== 1",
            met=round(replay_n) == 1,
        )
        contention = await sc.contended(ledger, sizes)
        report.add(
            "contended: executions of 50 callers",
            contention["executions_max"],
            target="== 1",
            met=contention["executions_max"] == 1,
        )
        report.add("contended: winner commit -> waiter return", contention["wake_ms"])
        approval = await sc.approval_wake(ledger, sizes, await in_process_approver(ledger))
        report.add(
            "approval wake, same process",
            approval,
            target="p50 <= 10 ms",
            met=approval.median <= 10,
        )
        approver = sc.ApproverProcess(bench_url)
        try:
            approval = await sc.approval_wake(ledger, sizes, approver.approve)
        finally:
            approver.close()
        # No LISTEN/NOTIFY: another process's decision is found by polling, as on
        # SQLite; the same target as SQLite's measured delay (docs/benchmarks.md).
        report.add(
            "approval wake, other process (polling)",
            approval,
            target="p50 <= 50 ms",
            met=approval.median <= 50,
        )
    finally:
        await store.close()
        async with admin._pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        await admin.close()
    return report


async def _mysql_statements(url: str, calls: int = 200) -> tuple[float, float]:
    """Statements per fresh run and per replay, as the server counts them: the
    ``Questions`` of the one session a store of one connection runs its steps on
    (other clients' traffic on the same server does not show)."""
    from agent_ledger.stores.mysql import MySQLStore

    store = await MySQLStore.connect(url, max_size=1)
    try:
        ledger = build_ledger(store)

        async def questions() -> int:
            async with store._pool.connection() as conn, conn.cursor() as cur:
                await cur.execute("SHOW SESSION STATUS LIKE 'Questions'")
                (_, value) = await cur.fetchone()
                return int(value)

        tag = uuid.uuid4().hex[:8]
        batch = [ToolCall(f"count-{tag}", "send", {"i": i}) for i in range(calls)]
        # The connection prepares each step's statement once, on its first use.
        await ledger.run(ToolCall(f"count-{tag}", "warm", {}), handler)
        await ledger.run(ToolCall(f"count-{tag}", "warm", {}), handler)
        figures = []
        for _ in ("fresh", "replay"):
            before = await questions()
            for call in batch:
                await ledger.run(call, handler)
            # The SHOW that reads the counter counts itself once.
            figures.append((await questions() - before - 1) / calls)
    finally:
        await store.close()
    return figures[0], figures[1]


async def _fill_postgres(conn: Any, table: Any, start: int, stop: int) -> None:
    from psycopg import sql

    await conn.execute(
        sql.SQL(
            "INSERT INTO {} (idem_key, workflow_id, tool, status, args_canonical, result,"
            " completed_at) SELECT md5(i::text) || md5((-i)::text), 'filler', 'filler',"
            " 'succeeded', '{{}}', 'true'::jsonb, clock_timestamp()"
            " FROM generate_series(%s::bigint, %s::bigint - 1) AS i"
        ).format(table),
        (start, stop),
    )
    await conn.execute(sql.SQL("ANALYZE {}").format(table))


async def _wal_rows(
    report: Report, dsn: str, store: Any, ledger: Any, floor: PostgresFloor, sizes: sc.Sizes
) -> None:
    """WAL bytes per replay: on the caller's path, exactly (EXPLAIN's WAL usage of
    begin's own statement on a finished effect, and whether it got a transaction id,
    without which its commit writes no record); and server-wide around sequential
    replays beside the same number of floor reads (other sessions on a shared server
    write too, and the batched counts are in the ledger's window)."""
    import psycopg

    from agent_ledger.stores._params import begin_params
    from agent_ledger.stores.base import NewEffect
    from agent_ledger.stores.postgres import _FINISHED

    n = sizes.calls
    run_id = uuid.uuid4().hex[:8]
    calls = sc.calls_for(run_id, n)
    keys = [f"{run_id}-{i:08d}".ljust(64, "0") for i in range(n)]
    for call in calls:
        await ledger.run(call, handler)
    for key in keys:
        await floor.fresh(key)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

        async def lsn() -> int:
            cursor = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
            return int(_one(await cursor.fetchone()))

        start = await lsn()
        for call in calls:
            await ledger.run(call, handler)
        middle = await lsn()
        for key in keys:
            await floor.replay(key)
        end = await lsn()
        # begin's statement as the store sends it, for each finished key (only the
        # key matters: it exists, so nothing else of the row is used), in one
        # transaction that is rolled back: its WAL usage by EXPLAIN, and whether
        # it was given a transaction id (without one, a commit writes no record).
        sample = calls[: min(n, 500)]
        wal_bytes = 0
        async with conn.transaction(force_rollback=True):
            # The store keeps its statements rendered (bytes) when its schema's name is ASCII.
            begin = store._begin
            prefix = "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "
            explain = (
                prefix.encode() + begin
                if isinstance(begin, bytes)
                else psycopg.sql.SQL(prefix) + begin
            )
            for call in sample:
                new = NewEffect(ledger.idem_key(call), "bench", None, "bench.tool", "{}", None)
                params = {**begin_params(new), "finished": _FINISHED, "lock_timeout": None}
                cursor = await conn.execute(explain, params)
                wal_bytes += int(_one(await cursor.fetchone())[0]["Plan"].get("WAL Bytes", 0))
            cursor = await conn.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL")
            got_xid = bool(_one(await cursor.fetchone()))
    # A replay never writes its row. Bytes here come from a read's page
    # housekeeping: PostgreSQL prunes dead row versions (the batched counts
    # leave some) when it reads a page, with no transaction id, no commit
    # record and no flush wait. The floor's rows are never updated.
    report.add(
        "transaction ids given to replays (caller's path)",
        int(got_xid),
        target="== 0",
        met=not got_xid,
    )
    report.add("WAL bytes per replay, caller's path (EXPLAIN)", wal_bytes / len(sample))
    report.add("WAL bytes per replay, server-wide window", (middle - start) / n)
    report.add("WAL bytes per floor read, server-wide window", (end - middle) / n)


def _one(row: tuple[Any, ...] | None) -> Any:
    """The single value of a one-row, one-column answer."""
    if row is None:
        raise RuntimeError("the query returned no row")
    return row[0]


async def _statements(dsn: str, schema: str) -> tuple[int, int]:
    from psycopg_pool import AsyncConnectionPool

    from agent_ledger.stores.postgres import PostgresStore

    with tempfile.TemporaryDirectory() as folder:
        wire = StatementCounter(Path(folder) / "trace")
        pool = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=1,
            kwargs={"autocommit": True},
            configure=wire.attach,
            open=False,
        )
        await pool.open(wait=True)
        store = PostgresStore(pool, schema=schema)
        try:
            ledger = build_ledger(store)
            await ledger.stats()  # a ledger's first call also reads the schema version, once
            call = sc.calls_for(uuid.uuid4().hex[:8], 1)[0]
            wire.mark()
            await ledger.run(call, handler)
            fresh = wire.count()
            await ledger.run(call, handler)
            replay = wire.count()
        finally:
            await store.close()
            await pool.close()
            wire.close()
    return fresh, replay


# -- entry point ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


async def run(stores: list[str], dsn: str, quick: bool, mysql_url: str) -> list[Report]:
    sizes = sc.Sizes.choose(quick)
    reports = []
    for store in stores:
        started = time.perf_counter()
        if store == "memory":
            report = await bench_memory(sizes)
        elif store == "sqlite":
            report = await bench_sqlite(sizes)
        elif store == "mysql":
            report = await bench_mysql(sizes, mysql_url)
        else:
            report = await bench_postgres(sizes, dsn)
        report.print()
        print(f"({time.perf_counter() - started:.0f} s)")
        reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--store", choices=["memory", "sqlite", "postgres", "mysql", "all"], default="all"
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL DSN (default: %(default)s)")
    parser.add_argument(
        "--mysql-url", default=DEFAULT_MYSQL_URL, help="MariaDB/MySQL URL (default: %(default)s)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--output", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args(argv)
    stores = ["memory", "sqlite", "postgres", "mysql"] if args.store == "all" else [args.store]
    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}")
    reports = asyncio.run(run(stores, args.dsn, args.quick, args.mysql_url))
    args.output.mkdir(parents=True, exist_ok=True)
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    for report in reports:
        path = args.output / f"{date}-{report.store}.json"
        payload = {
            "date": date,
            "quick": args.quick,
            "machine": info,
            "store": report.store,
            "rows": report.rows,
        }
        path.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
        print(f"wrote {path}")
    missed = [r["what"] for report in reports for r in report.rows if r["met"] is False]
    if missed:
        print(f"\ntargets missed: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
