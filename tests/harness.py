"""Store harnesses: a store under test plus a back door into what it holds.

psycopg is imported only where a Postgres harness is opened, so the Memory and
SQLite tiers run (and the Postgres ones skip) where the `postgres` extra is
not installed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from agent_ledger import EffectLedger, RunOptions
from agent_ledger.clock import ManualClock
from agent_ledger.stores.base import Store
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.testing import build_ledger

if TYPE_CHECKING:
    from agent_ledger.stores.mysql import MySQLStore
    from agent_ledger.stores.postgres import PostgresStore


class StoreHarness(Protocol):
    # Read-only members, so a harness may hold a concrete store (MemoryStore, ...).
    @property
    def kind(self) -> str: ...

    @property
    def store(self) -> Store: ...

    async def age(self, ms: float) -> None:
        """Make every stored timestamp ``ms`` older, as if that much time passed."""
        ...

    async def raw_count(self) -> int:
        """How many effects are stored, read without the store's API."""
        ...

    def ledger(self, defaults: RunOptions | None = None) -> EffectLedger: ...


@dataclass
class MemoryHarness:
    kind: str = "memory"
    clock: ManualClock = field(default_factory=ManualClock)
    store: MemoryStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = MemoryStore(clock=self.clock)

    async def age(self, ms: float) -> None:
        self.clock.advance(ms=ms)

    async def raw_count(self) -> int:
        return len(self.store)

    def ledger(self, defaults: RunOptions | None = None) -> EffectLedger:
        return build_ledger(self.store, defaults=defaults)


# --- PostgreSQL -----------------------------------------------------------------

DSN = os.environ.get("AGENT_LEDGER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("AGENT_LEDGER_REQUIRE_POSTGRES") == "1"
#: One schema per test session, so parallel runs and leftovers never collide.
TEST_SCHEMA = f"agent_ledger_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
#: The same, with the effects table partitioned (the "postgres-partitioned" kind).
PARTITIONED_SCHEMA = TEST_SCHEMA + "_p"


PSYCOPG_MISSING = "psycopg is not installed (pip install -e '.[postgres]')"


@functools.cache
def psycopg_installed() -> bool:
    """Whether the `postgres` extra (psycopg and its pool) can be imported."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def postgres_unavailable() -> str | None:
    """Why Postgres tests cannot run here, or None if they can (checked once)."""
    if not psycopg_installed():
        return PSYCOPG_MISSING
    import psycopg

    try:
        with psycopg.connect(DSN, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL not reachable at {DSN}: {str(exc).strip().splitlines()[0]}"
    return None


def require_postgres() -> None:
    """Skip (or, with AGENT_LEDGER_REQUIRE_POSTGRES=1, fail) without a server."""
    reason = postgres_unavailable()
    if reason is None:
        return
    if REQUIRE_POSTGRES:
        pytest.fail(f"AGENT_LEDGER_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


_schema_ready = False


async def ensure_test_schema() -> None:
    global _schema_ready
    if _schema_ready:
        return
    from agent_ledger.stores.postgres import PostgresStore

    store = await PostgresStore.connect(DSN, schema=TEST_SCHEMA, min_size=1, max_size=2)
    try:
        await store.create_schema()
    finally:
        await store.close()
    _schema_ready = True


_partitioned_ready = False


async def ensure_partitioned_schema() -> None:
    """PARTITIONED_SCHEMA, created partitioned (monthly), once per session."""
    global _partitioned_ready
    if _partitioned_ready:
        return
    from agent_ledger.stores.postgres import PostgresStore

    store = await PostgresStore.connect(
        DSN, schema=PARTITIONED_SCHEMA, min_size=1, max_size=2, partitioned=True
    )
    try:
        await store.create_schema()
    finally:
        await store.close()
    _partitioned_ready = True


async def ensure_history_partition(backdoor: Any) -> None:
    """A partition for every time before the first monthly one, so that a test
    can age its effects into the past (a purge may have dropped it: made again)."""
    from psycopg import sql

    effects = sql.Identifier(PARTITIONED_SCHEMA, "agent_ledger_effects")
    history = sql.Identifier(PARTITIONED_SCHEMA, "agent_ledger_effects_p00010101")
    cursor = await backdoor.execute(
        sql.SQL("SELECT min(lo) FROM {}() WHERE lo IS NOT NULL").format(
            sql.Identifier(PARTITIONED_SCHEMA, "agent_ledger_effect_partitions")
        )
    )
    (first,) = await cursor.fetchone()
    cursor = await backdoor.execute(
        sql.SQL("SELECT count(*) FROM {}() WHERE lo IS NULL OR lo < %s").format(
            sql.Identifier(PARTITIONED_SCHEMA, "agent_ledger_effect_partitions")
        ),
        (first,),
    )
    (before,) = await cursor.fetchone()
    if before == 0:
        await backdoor.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM (MINVALUE) TO ({})").format(
                history, effects, sql.Literal(first)
            )
        )


def drop_test_schema() -> None:
    if not (_schema_ready or _partitioned_ready):
        return
    import psycopg
    from psycopg import sql

    with psycopg.connect(DSN, autocommit=True) as conn:
        for schema in (TEST_SCHEMA, PARTITIONED_SCHEMA):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@dataclass
class PostgresHarness:
    store: PostgresStore
    #: The back door: its own connection, not the store's pool.
    backdoor: Any
    kind: str = "postgres"
    #: Where its tables are: TEST_SCHEMA, or PARTITIONED_SCHEMA (with a key table).
    schema: str = TEST_SCHEMA

    def _table(self) -> Any:
        from psycopg import sql

        return sql.Identifier(self.schema, "agent_ledger_effects")

    async def _sql(self, query: Any, *params: object) -> Any:
        cursor = await self.backdoor.execute(query, params or None)
        return await cursor.fetchone() if cursor.description else None

    async def age(self, ms: float) -> None:
        from psycopg import sql

        await self._sql(
            sql.SQL(
                "UPDATE {} SET heartbeat_at = heartbeat_at - %s * interval '1 millisecond',"
                " created_at = created_at - %s * interval '1 millisecond',"
                " updated_at = updated_at - %s * interval '1 millisecond',"
                " completed_at = completed_at - %s * interval '1 millisecond'"
            ).format(self._table()),
            ms,
            ms,
            ms,
            ms,
        )
        if self.schema == PARTITIONED_SCHEMA:
            # The key table names each effect's partition by its created_at.
            await self._sql(
                sql.SQL(
                    "UPDATE {} SET created_at = created_at - %s * interval '1 millisecond'"
                ).format(sql.Identifier(self.schema, "agent_ledger_effect_keys")),
                ms,
            )
        # Budget holds age too: their expiry comes closer.
        await self._sql(
            sql.SQL("UPDATE {} SET expires_at = expires_at - %s * interval '1 millisecond'").format(
                sql.Identifier(self.schema, "agent_ledger_budget_holds")
            ),
            ms,
        )
        # Sagas age with the effects: their owners' heartbeats too.
        await self._sql(
            sql.SQL(
                "UPDATE {} SET heartbeat_at = heartbeat_at - %s * interval '1 millisecond',"
                " created_at = created_at - %s * interval '1 millisecond',"
                " updated_at = updated_at - %s * interval '1 millisecond'"
            ).format(sql.Identifier(self.schema, "agent_ledger_sagas")),
            ms,
            ms,
            ms,
        )

    async def raw_count(self) -> int:
        from psycopg import sql

        row = await self._sql(sql.SQL("SELECT count(*) FROM {}").format(self._table()))
        return int(row[0])

    def ledger(self, defaults: RunOptions | None = None) -> EffectLedger:
        return build_ledger(self.store, defaults=defaults)


#: Where SQLite harnesses keep their files: a RAM-backed folder where the machine
#: has one (Linux's /dev/shm), else the temp dir. Still a real file with its WAL
#: and locks; only the fsyncs cost nothing (about 0.1 s a test on a busy disk).
SQLITE_FOLDER = next(
    (str(d) for d in (Path("/dev/shm"),) if d.is_dir() and os.access(d, os.W_OK | os.X_OK)),
    None,
)


@dataclass
class SqliteHarness:
    path: Path
    kind: str = "sqlite"
    clock: ManualClock = field(default_factory=ManualClock)
    store: SqliteStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = SqliteStore(self.path, clock=self.clock, synchronous="NORMAL")

    async def age(self, ms: float) -> None:
        self.clock.advance(ms=ms)

    async def raw_count(self) -> int:
        # The back door: a separate plain sqlite3 connection to the same file.
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            return int(conn.execute("SELECT count(*) FROM agent_ledger_effects").fetchone()[0])

    def ledger(self, defaults: RunOptions | None = None) -> EffectLedger:
        return build_ledger(self.store, defaults=defaults)


# --- MariaDB / MySQL ----------------------------------------------------------------

#: The server the MySQL tests use; each test session works in a database of its own.
MYSQL_URL = os.environ.get("AGENT_LEDGER_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
REQUIRE_MYSQL = os.environ.get("AGENT_LEDGER_REQUIRE_MYSQL") == "1"
#: One database per test session (MySQL's schemas are databases), dropped at its end.
TEST_DATABASE = f"agent_ledger_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
#: The tables of a MySQL ledger, children before the tables they reference.
MYSQL_TABLES = (
    "agent_ledger_saga_steps",
    "agent_ledger_sagas",
    "agent_ledger_budget_holds",
    "agent_ledger_budget_charges",
    "agent_ledger_budgets",
    "agent_ledger_legacy_keys",
    "agent_ledger_effects",
    # Schema version 4.
    "agent_ledger_approvals",
    "agent_ledger_decision_attempts",
    "agent_ledger_used_links",
)
ASYNCMY_MISSING = "asyncmy is not installed (pip install -e '.[mysql]')"


def mysql_test_url() -> str:
    """``MYSQL_URL`` with this session's database in place of the one it names."""
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(MYSQL_URL)._replace(path="/" + TEST_DATABASE))


def _in_a_thread(work: Any) -> Any:
    """Run the coroutine function ``work`` on an event loop of its own, from sync or
    async code alike (the checks below run inside fixtures' loops too)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work()).result()


async def _root_sql(statement: str) -> None:
    """One statement on a fresh connection to the URL's own database (``test``)."""
    from urllib.parse import unquote, urlsplit

    import asyncmy

    parts = urlsplit(MYSQL_URL)
    conn = await asyncmy.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/") or "test",
        connect_timeout=5,
        autocommit=True,
    )
    try:
        async with conn.cursor() as cur:
            await cur.execute(statement)
    finally:
        conn.close()


@functools.cache
def mysql_unavailable() -> str | None:
    """Why MySQL tests cannot run here, or None if they can (checked once)."""
    try:
        import asyncmy  # noqa: F401
    except ImportError:
        return ASYNCMY_MISSING
    try:
        _in_a_thread(lambda: _root_sql("SELECT 1"))
    except Exception as exc:
        return f"MariaDB/MySQL not reachable at {MYSQL_URL}: {str(exc).strip().splitlines()[0]}"
    return None


def require_mysql() -> None:
    """Skip (or, with AGENT_LEDGER_REQUIRE_MYSQL=1, fail) without a server."""
    reason = mysql_unavailable()
    if reason is None:
        return
    if REQUIRE_MYSQL:
        pytest.fail(f"AGENT_LEDGER_REQUIRE_MYSQL=1 but {reason}", pytrace=False)
    pytest.skip(reason)


_database_ready = False


async def ensure_test_database() -> None:
    global _database_ready
    if _database_ready:
        return
    from agent_ledger.stores.mysql import MySQLStore

    await _root_sql(f"CREATE DATABASE IF NOT EXISTS `{TEST_DATABASE}`")
    store = await MySQLStore.connect(mysql_test_url(), max_size=1)
    try:
        await store.create_schema()
    finally:
        await store.close()
    _database_ready = True


def drop_test_database() -> None:
    if not _database_ready:
        return
    _in_a_thread(lambda: _root_sql(f"DROP DATABASE IF EXISTS `{TEST_DATABASE}`"))


@dataclass
class MySQLHarness:
    store: MySQLStore
    #: The back door: its own asyncmy connection, not the store's pool.
    backdoor: Any
    kind: str = "mysql"

    async def _sql(self, statement: str, *params: object) -> Any:
        async with self.backdoor.cursor() as cur:
            await cur.execute(statement, params or None)
            return await cur.fetchone() if cur.description else None

    async def age(self, ms: float) -> None:
        us = round(ms * 1000)
        await self._sql(
            "UPDATE agent_ledger_effects SET heartbeat_at = heartbeat_at - INTERVAL %s MICROSECOND,"
            " created_at = created_at - INTERVAL %s MICROSECOND,"
            " updated_at = updated_at - INTERVAL %s MICROSECOND,"
            " completed_at = completed_at - INTERVAL %s MICROSECOND",
            us,
            us,
            us,
            us,
        )
        # Budget holds age too: their expiry comes closer.
        await self._sql(
            "UPDATE agent_ledger_budget_holds"
            " SET expires_at = expires_at - INTERVAL %s MICROSECOND",
            us,
        )
        # Sagas age with the effects: their owners' heartbeats too.
        await self._sql(
            "UPDATE agent_ledger_sagas SET heartbeat_at = heartbeat_at - INTERVAL %s MICROSECOND,"
            " created_at = created_at - INTERVAL %s MICROSECOND,"
            " updated_at = updated_at - INTERVAL %s MICROSECOND",
            us,
            us,
            us,
        )

    async def raw_count(self) -> int:
        row = await self._sql("SELECT COUNT(*) FROM agent_ledger_effects")
        return int(row[0])

    def ledger(self, defaults: RunOptions | None = None) -> EffectLedger:
        return build_ledger(self.store, defaults=defaults)


async def mysql_backdoor() -> Any:
    """A plain asyncmy connection to this session's database, in autocommit."""
    import asyncmy

    from agent_ledger.stores.mysql import _settings_from_url

    settings = _settings_from_url(mysql_test_url(), 5.0)
    return await asyncmy.connect(**{k: v for k, v in settings.items() if k not in ("client_flag",)})


STORE_KINDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
    # The same PostgresStore with its pool behind PgBouncer in transaction mode
    # (tests/pgbouncer.py): every contract test again, in the slow tier.
    pytest.param(
        "postgres-pgbouncer",
        id="pgbouncer",
        marks=[pytest.mark.postgres, pytest.mark.pgbouncer, pytest.mark.slow],
    ),
    # The same PostgresStore on a partitioned effects table
    # (postgres_partitioned.sql): every contract test again, in the slow tier.
    pytest.param(
        "postgres-partitioned",
        id="partitioned",
        marks=[pytest.mark.postgres, pytest.mark.slow],
    ),
]
#: The stores whose transactions lock rows, not the whole store: a step
#: without ``tx=`` goes on beside an open transaction, and heartbeats too.
ROW_LOCKING = frozenset({"postgres", "mysql"})

#: The store plain `pytest` runs feature tests on (see tests/conftest.py): the
#: default store, with real SQL and a real file, and quick to set up.
REPRESENTATIVE_STORE = "sqlite"


#: Every table of a PostgreSQL store, parents before children.
_POSTGRES_TABLES = (
    "agent_ledger_effects",
    "agent_ledger_legacy_keys",
    "agent_ledger_sagas",
    "agent_ledger_saga_steps",
    "agent_ledger_budgets",
    "agent_ledger_budget_holds",
    "agent_ledger_budget_charges",
    # Schema version 4.
    "agent_ledger_approvals",
    "agent_ledger_decision_attempts",
    "agent_ledger_used_links",
)


def empty_tables(schema: str, tables: tuple[str, ...] = _POSTGRES_TABLES) -> Any:
    """One statement string that empties ``tables`` of ``schema``.

    DELETE, not TRUNCATE: the tables hold a test's few rows, and TRUNCATE costs
    about 150 ms (new files, synced) where DELETE costs about 1 ms. Children
    first, for the foreign keys; one string, so one round trip and one
    transaction.
    """
    from psycopg import sql

    return sql.SQL("; ").join(
        sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, name)) for name in reversed(tables)
    )


def require_pgbouncer() -> str:
    """The DSN of this session's PgBouncer in front of the test server (started once).

    Skips without the server or the binary (fails with
    AGENT_LEDGER_REQUIRE_POSTGRES=1: .ci/run installs the package).
    """
    require_postgres()
    from tests.pgbouncer import pgbouncer_missing, started_pgbouncer

    reason = pgbouncer_missing()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(f"AGENT_LEDGER_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return started_pgbouncer(DSN).dsn


@asynccontextmanager
async def open_harness(kind: str) -> AsyncIterator[StoreHarness]:
    if kind == "memory":
        yield MemoryHarness()
        return
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="agent-ledger-", dir=SQLITE_FOLDER) as folder:
            harness = SqliteHarness(Path(folder) / "ledger.db")
            try:
                yield harness
            finally:
                await harness.store.close()
        return
    if kind in ("postgres", "postgres-pgbouncer", "postgres-partitioned"):
        require_postgres()
        # Through PgBouncer: the pool goes through it, notifications come
        # directly (listen_dsn), as docs/postgres.md advises.
        pool_dsn = require_pgbouncer() if kind == "postgres-pgbouncer" else DSN
        listen_dsn = DSN if kind == "postgres-pgbouncer" else None
        partitioned = kind == "postgres-partitioned"
        schema = PARTITIONED_SCHEMA if partitioned else TEST_SCHEMA
        if partitioned:
            await ensure_partitioned_schema()
        else:
            await ensure_test_schema()
        import psycopg

        from agent_ledger.stores.postgres import PostgresStore

        store = await PostgresStore.connect(
            pool_dsn, schema=schema, min_size=1, max_size=8, listen_dsn=listen_dsn,
            partitioned=True if partitioned else None,
        )  # fmt: skip
        backdoor = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
        pg_harness = PostgresHarness(store, backdoor, schema=schema)
        try:
            if partitioned:
                await ensure_history_partition(backdoor)
            tables = (*_POSTGRES_TABLES, "agent_ledger_effect_keys") if partitioned else ()
            await backdoor.execute(empty_tables(schema, tables or _POSTGRES_TABLES))
            yield pg_harness
        finally:
            await store.close()
            await backdoor.close()
        return
    if kind == "mysql":
        require_mysql()
        await ensure_test_database()
        from agent_ledger.stores.mysql import MySQLStore

        my_store = await MySQLStore.connect(mysql_test_url(), max_size=8)
        backdoor = await mysql_backdoor()
        my_harness = MySQLHarness(my_store, backdoor)
        try:
            # One transaction, so clearing the tables costs one log flush.
            await backdoor.begin()
            for table in MYSQL_TABLES:
                await my_harness._sql(f"DELETE FROM {table}")
            await backdoor.commit()
            yield my_harness
        finally:
            await my_store.close()
            backdoor.close()
        return
    raise ValueError(f"unknown store kind {kind!r}")
