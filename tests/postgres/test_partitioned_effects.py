"""The partitioned effects table (postgres_partitioned.sql): what differs from the plain one.

The whole store contract runs on it too (tests/harness.py, kind
"postgres-partitioned", slow tier); these pin what only it has: purge by
partition and what that purge still keeps, the one-partition replay, the key
table, partitions made on demand, an interrupted purge finished, the
conversion of a ledger that holds effects, and the refusals.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql

from agent_ledger import Effect, EffectStoreError, ToolCall
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores import _postgres_partitions as part
from agent_ledger.stores.base import EffectQuery, NewEffect, SchemaMigration
from agent_ledger.stores.postgres import SCHEMA_VERSION, PostgresStore
from agent_ledger.testing import build_ledger

#: Three past months: purge cut-offs fall after them.
PAST = [datetime(2025, m, 1, tzinfo=UTC) for m in (1, 2, 3)]

T = TypeVar("T")


def _appending(into: list[int], value: T) -> Callable[[Effect], T]:
    """A handler that notes its run in ``into`` and returns ``value``."""

    def handler(effect: Effect) -> T:
        into.append(1)
        return value

    return handler


class Schema:
    """A schema of its own, a back door, and stores made on it."""

    def __init__(self, dsn: str, name: str, conn: psycopg.AsyncConnection[Any]) -> None:
        self.dsn, self.name, self.conn = dsn, name, conn
        self.stores: list[PostgresStore] = []

    def ident(self, table: str) -> sql.Identifier:
        return sql.Identifier(self.name, table)

    async def store(self, partitioned: bool | None = None) -> PostgresStore:
        store = await PostgresStore.connect(
            self.dsn, schema=self.name, max_size=2, partitioned=partitioned
        )
        self.stores.append(store)
        return store

    async def one(self, query: sql.Composable | str, *params: object) -> Any:
        cursor = await self.conn.execute(query, params or None)  # type: ignore[arg-type]
        row = await cursor.fetchone()
        return None if row is None else row[0]

    async def past_partition(self, lo: datetime) -> str:
        """Attach a month's partition before the ones init made."""
        name = f"agent_ledger_effects_p{lo:%Y%m%d}"
        hi = (lo + timedelta(days=32)).replace(day=1)
        await self.conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                self.ident(name), self.ident("agent_ledger_effects"), sql.Literal(lo),
                sql.Literal(hi),
            )
        )  # fmt: skip
        return name

    async def move(self, idem_key: str, at: datetime) -> None:
        """Make an effect created (and finished, if it is) at ``at``: it moves partition."""
        await self.conn.execute(
            sql.SQL(
                "UPDATE {} SET created_at = %s, updated_at = %s, started_at = %s,"
                " completed_at = CASE WHEN completed_at IS NOT NULL THEN %s END"
                " WHERE idem_key = %s"
            ).format(self.ident("agent_ledger_effects")),
            (at, at, at, at, idem_key),
        )
        await self.conn.execute(
            sql.SQL("UPDATE {} SET created_at = %s WHERE idem_key = %s").format(
                self.ident(part.KEYS_TABLE)
            ),
            (at, idem_key),
        )

    async def exists(self, table: str) -> bool:
        return bool(await self.one("SELECT to_regclass(%s) IS NOT NULL", f"{self.name}.{table}"))

    async def count(self, table: str) -> int:
        return int(await self.one(sql.SQL("SELECT count(*) FROM {}").format(self.ident(table))))


@pytest.fixture
async def schema(dsn: str) -> AsyncIterator[Schema]:
    name = f"agent_ledger_part_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        s = Schema(dsn, name, conn)
        try:
            yield s
        finally:
            for store in s.stores:
                await store.close()
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
            )


async def _partitioned(schema: Schema) -> PostgresStore:
    store = await schema.store(partitioned=True)
    await store.create_schema()
    return store


def _new(key: str, *, requires_approval: bool = False) -> NewEffect:
    return NewEffect(key, "wf", None, "tool", "{}", None, requires_approval=requires_approval)


async def _done(
    store: PostgresStore, key: str, status: EffectStatus = EffectStatus.SUCCEEDED
) -> str:
    """A fresh effect, finished (succeeded unless told); its id."""
    outcome = await store.begin(_new(key))
    assert outcome.created
    effect = outcome.effect
    assert await store.commit(
        effect.id, attempt=1, status=status, result_json='{"ok": 1}', error=None
    )
    return effect.id


async def test_the_partitioned_table_has_the_plain_tables_columns_and_checks(
    schema: Schema,
) -> None:
    store = await _partitioned(schema)
    plain_store = await PostgresStore.connect(schema.dsn, schema=schema.name + "_plain")
    schema.stores.append(plain_store)
    try:
        await plain_store.create_schema()
        described = []
        for name in (schema.name, schema.name + "_plain"):
            columns = await schema.conn.execute(
                "SELECT column_name, data_type, column_default, is_nullable"
                " FROM information_schema.columns WHERE table_schema = %s"
                " AND table_name = 'agent_ledger_effects' ORDER BY ordinal_position",
                (name,),
            )
            checks = await schema.conn.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = to_regclass(%s) AND contype = 'c' ORDER BY conname",
                (f"{name}.agent_ledger_effects",),
            )
            described.append((await columns.fetchall(), await checks.fetchall()))
        assert described[0] == described[1]
        assert (
            await schema.one(
                "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)",
                f"{schema.name}.agent_ledger_effects",
            )
            == "p"
        )
        assert await store.check_schema() == SCHEMA_VERSION
    finally:
        await schema.conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(schema.name + "_plain")
            )
        )


async def test_migrate_and_create_schema_again_change_nothing(schema: Schema) -> None:
    store = await _partitioned(schema)
    partitions = await schema.count("agent_ledger_effect_keys") , await schema.one(
        sql.SQL("SELECT count(*) FROM {}()").format(schema.ident("agent_ledger_effect_partitions"))
    )  # fmt: skip
    assert await store.migrate() == SchemaMigration(SCHEMA_VERSION, SCHEMA_VERSION)
    await store.create_schema()
    assert await store.partition() == "already partitioned"
    assert (
        await schema.count("agent_ledger_effect_keys"),
        await schema.one(
            sql.SQL("SELECT count(*) FROM {}()").format(
                schema.ident("agent_ledger_effect_partitions")
            )
        ),
    ) == partitions


async def test_a_key_is_one_effect_and_a_replay_reads_one_partition(schema: Schema) -> None:
    store = await _partitioned(schema)
    for lo in PAST:
        await schema.past_partition(lo)
    ledger = build_ledger(store)
    call = ToolCall(workflow_id="wf", tool="pay", args={"n": 1})
    runs: list[int] = []
    assert await ledger.run(call, _appending(runs, "paid")) == "paid"
    key = ledger.idem_key(call)
    await schema.move(key, PAST[1] + timedelta(days=3))
    # Another store (no cache of the key): the insert conflicts, the read finds it.
    other = build_ledger(await schema.store())
    assert await other.run(call, _appending(runs, "again")) == "paid"
    assert runs == [1]
    assert await schema.count(part.KEYS_TABLE) == 1
    # The replay's read probes only the partition the key row names.
    find = sql.SQL(part.FIND).format(
        effects=schema.ident("agent_ledger_effects"), keys=schema.ident(part.KEYS_TABLE)
    )
    cursor = await schema.conn.execute(
        sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + find, {"idem_key": key}
    )
    (plan,) = await cursor.fetchone() or (None,)
    scanned: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node and node.get("Actual Loops", 0) > 0:
            scanned.append(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk((plan if isinstance(plan, list) else json.loads(str(plan)))[0]["Plan"])
    assert sorted(scanned) == sorted([part.KEYS_TABLE, "agent_ledger_effects_p20250201"])


async def test_purge_drops_whole_partitions_and_keeps_what_purge_keeps(schema: Schema) -> None:
    store = await _partitioned(schema)
    names = [await schema.past_partition(lo) for lo in PAST]
    # January: three finished effects, all purgeable: the partition goes.
    for i in range(3):
        await _done(store, f"jan-{i}")
        await schema.move(f"jan-{i}", PAST[0] + timedelta(days=i))
    # February: two finished, one waiting for a person: it stays, loses two rows.
    for i in range(2):
        await _done(store, f"feb-{i}")
        await schema.move(f"feb-{i}", PAST[1])
    await store.begin(_new("feb-pending", requires_approval=True))
    await schema.move("feb-pending", PAST[1])
    # March: a saga's step (kept, as purge keeps them) and a failed effect (purged).
    await _done(store, "mar-step")
    await schema.move("mar-step", PAST[2])
    await _done(store, "mar-failed", EffectStatus.FAILED)
    await schema.move("mar-failed", PAST[2])
    await schema.conn.execute(
        sql.SQL(
            "INSERT INTO {} (saga_id, status, lease_ms) VALUES ('s', 'completed', 0);"
            " INSERT INTO {} (saga_id, position, group_index, tool, idem_key, compensate_if)"
            " VALUES ('s', 0, 0, 'tool', 'mar-step', 'succeeded')"
        ).format(schema.ident("agent_ledger_sagas"), schema.ident("agent_ledger_saga_steps"))
    )
    # Now: finished just now, kept (newer than the cut-off).
    await _done(store, "now")

    purged = await store.purge(older_than=timedelta(days=30), statuses=TERMINAL)

    assert purged == 3 + 2 + 1
    assert not await schema.exists(names[0])
    assert await schema.exists(names[1]) and await schema.exists(names[2])
    left = await schema.conn.execute(
        sql.SQL("SELECT idem_key FROM {} ORDER BY 1").format(schema.ident("agent_ledger_effects"))
    )
    assert [k for (k,) in await left.fetchall()] == ["feb-pending", "mar-step", "now"]
    keys = await schema.conn.execute(
        sql.SQL("SELECT idem_key FROM {} ORDER BY 1").format(schema.ident(part.KEYS_TABLE))
    )
    assert [k for (k,) in await keys.fetchall()] == ["feb-pending", "mar-step", "now"]
    # A purged key is free again; a kept one still answers.
    assert (await store.begin(_new("jan-0"))).created
    assert not (await store.begin(_new("feb-pending"))).created
    # The partitions ahead are there (purge tops them up).
    ahead = await schema.one(
        sql.SQL("SELECT count(*) FROM {}() WHERE lo > clock_timestamp()").format(
            schema.ident("agent_ledger_effect_partitions")
        )
    )
    assert ahead >= 3


async def test_an_interrupted_purge_is_finished_and_its_keys_are_free_meanwhile(
    schema: Schema,
) -> None:
    store = await _partitioned(schema)
    name = await schema.past_partition(PAST[0])
    for i in range(2):
        await _done(store, f"old-{i}")
        await schema.move(f"old-{i}", PAST[0])
    # A purge detached the partition and stopped there (killed).
    await schema.conn.execute(
        sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
            schema.ident("agent_ledger_effects"), schema.ident(name)
        )
    )
    # Its keys' rows are left; a begin of one finds no effect behind it and
    # takes the key for a new effect.
    fresh = await (await schema.store()).begin(_new("old-0"))
    assert fresh.created
    assert await store.purge(older_than=timedelta(days=30), statuses=TERMINAL) == 2
    assert not await schema.exists(name)
    effect = await store.find("old-0")
    assert effect is not None and effect.id == fresh.effect.id
    assert await schema.count(part.KEYS_TABLE) == 1


async def test_a_begin_that_meets_no_partition_makes_it(schema: Schema) -> None:
    store = await _partitioned(schema)
    current = await schema.one(
        sql.SQL("SELECT name FROM {}() WHERE lo <= clock_timestamp() AND hi > clock_timestamp()")
        .format(schema.ident("agent_ledger_effect_partitions"))
    )  # fmt: skip
    drop = sql.SQL("DROP TABLE {}").format(schema.ident(current))
    await schema.conn.execute(drop)
    outcome = await store.begin(_new("k"))
    assert outcome.created
    assert await schema.exists(current)
    # Inside a caller's transaction too: the failed insert is undone, the
    # partition made on another connection, and the insert tried again.
    await schema.conn.execute(sql.SQL("DELETE FROM {}").format(schema.ident(part.KEYS_TABLE)))
    await schema.conn.execute(drop)
    async with store.transaction() as tx:
        inside = await store.begin(_new("k2"), tx=tx)
    assert inside.created
    effect = await store.find("k2")
    assert effect is not None and effect.id == inside.effect.id


async def test_converting_a_ledger_keeps_every_effect(schema: Schema) -> None:
    plain = await schema.store()
    await plain.create_schema()
    ledger = build_ledger(plain)
    calls = [ToolCall(workflow_id="wf", tool="pay", args={"n": n}) for n in range(5)]
    for n, call in enumerate(calls):
        assert await ledger.run(call, _appending([], {"paid": n})) == {"paid": n}
    before = {e.idem_key: e for e in await plain.list_effects(EffectQuery(limit=100))}
    # An implicit conversion is refused: it would lock the table for long.
    refusing = await schema.store(partitioned=True)
    with pytest.raises(EffectStoreError, match="init --partitioned"):
        await refusing.create_schema()
    assert (
        await schema.one(
            "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)",
            f"{schema.name}.agent_ledger_effects",
        )
        == "r"
    )
    # The store made for the plain table refuses the partitioned one, and
    # one made for either reads the catalogue.
    assert await plain.partition(period="month") == "partitioned"
    assert await schema.exists("agent_ledger_effects_legacy")
    assert await schema.count(part.KEYS_TABLE) == 5
    stale = await schema.store(partitioned=False)
    with pytest.raises(EffectStoreError, match="partitioned"):
        await stale.begin(_new("k"))
    again = build_ledger(await schema.store())
    ran: list[int] = []
    for n, call in enumerate(calls):
        assert await again.run(call, _appending(ran, {"paid": -1})) == {"paid": n}
    assert ran == []
    after = {e.idem_key: e for e in await again.store.list_effects(EffectQuery(limit=100))}
    assert {k: (e.id, e.status, e.result) for k, e in after.items()} == {
        k: (e.id, e.status, e.result) for k, e in before.items()
    }
    new = ToolCall(workflow_id="wf", tool="pay", args={"n": 99})
    assert await again.run(new, lambda e: "new") == "new"
    assert await schema.count(part.KEYS_TABLE) == 6


async def test_bad_partition_arguments_change_nothing(schema: Schema) -> None:
    store = await schema.store()
    await store.create_schema()
    for kwargs in ({"period": "year"}, {"ahead": 0}, {"ahead": True}):
        with pytest.raises(Exception, match=r"period|ahead") as raised:
            await store.partition(**kwargs)
        assert type(raised.value).__name__ == "EffectLedgerValidationError"
    assert (
        await schema.one(
            "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)",
            f"{schema.name}.agent_ledger_effects",
        )
        == "r"
    )


async def test_init_partitioned_from_the_command_line(schema: Schema) -> None:
    url = f"{schema.dsn}?schema={schema.name}"
    run = [sys.executable, "-m", "agent_ledger", "init", "--partitioned", "--period", "week"]

    def cli() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*run, "--url", url], capture_output=True, text=True, timeout=60)

    done = await asyncio.to_thread(cli)
    assert done.returncode == 0, done.stderr
    assert "effects table partitioned by week" in done.stdout
    assert (
        await schema.one(
            sql.SQL("SELECT period FROM {}").format(schema.ident(part.PARTITIONING_TABLE))
        )
        == "week"
    )
    again = await asyncio.to_thread(cli)
    assert "already partitioned (its period unchanged)" in again.stdout


async def test_the_postgres_pages_partitioned_section_runs(dsn: str, tmp_path: Path) -> None:
    """docs/postgres.md, "A hundred million effects": its init command makes the
    docs' schema partitioned, its SQL lists the partitions, its example runs."""
    from tests.test_docs import ROOT, _blocks, _docs_schema, _run_python

    page = ROOT / "docs" / "postgres.md"
    (init,) = [b for b in _blocks(page, "bash") if "--partitioned" in b]
    (listing,) = [b for b in _blocks(page, "sql") if "agent_ledger_effect_partitions()" in b]
    (example,) = [b for b in _blocks(page, "python") if "partitioned=True" in b]
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "DATABASE_URL": dsn, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}

    def session() -> tuple[subprocess.CompletedProcess[str], list[Any]]:
        with _docs_schema() as conn:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", init], env=env, capture_output=True,
                text=True, timeout=60,
            )  # fmt: skip
            rows = conn.execute(listing).fetchall() if done.returncode == 0 else []
            return done, rows

    done, rows = await asyncio.to_thread(session)
    assert done.returncode == 0, done.stderr
    assert "effects table partitioned by month" in done.stdout
    assert len(rows) == 4  # this month's partition and 3 ahead
    script = tmp_path / "partitioned.py"
    script.write_text(example)

    def twice() -> list[subprocess.CompletedProcess[str]]:
        with _docs_schema():  # a reader runs it again
            return [_run_python(script, tmp_path) for _ in range(2)]

    for ran in await asyncio.to_thread(twice):
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines() == ["{'charge': 'ch_1'}", "0"]


async def test_a_detached_partition_holding_a_keeper_is_attached_again(schema: Schema) -> None:
    """A purge stopped after its detach, and the partition holds something purge keeps
    (a person reopened an effect just before): the next purge attaches it again,
    without the effect a begin superseded meanwhile, and purges it row by row."""
    store = await _partitioned(schema)
    name = await schema.past_partition(PAST[0])
    await store.begin(_new("keep", requires_approval=True))
    await _done(store, "gone")
    await _done(store, "taken")
    for key in ("keep", "gone", "taken"):
        await schema.move(key, PAST[0])
    await schema.conn.execute(
        sql.SQL("ALTER TABLE {} DETACH PARTITION {} CONCURRENTLY").format(
            schema.ident("agent_ledger_effects"), schema.ident(name)
        )
    )
    fresh = await (await schema.store()).begin(_new("taken"))
    assert fresh.created

    assert await store.purge(older_than=timedelta(days=30), statuses=TERMINAL) == 1

    attached = await schema.one(
        sql.SQL("SELECT count(*) FROM {}() WHERE name = %s").format(
            schema.ident("agent_ledger_effect_partitions")
        ),
        name,
    )
    assert attached == 1
    rows = await schema.conn.execute(
        sql.SQL("SELECT idem_key, id::text, status FROM {} ORDER BY 1").format(
            schema.ident("agent_ledger_effects")
        )
    )
    found = [(k, s) for k, _, s in await rows.fetchall()]
    assert found == [("keep", "requires_approval"), ("taken", "processing")]
    taken = await store.find("taken")
    assert taken is not None and taken.id == fresh.effect.id
