"""The floor under each store: the same physical work without the ledger.

Each ledger figure is printed as a ratio to one of these, measured in the
same run on the same machine and store, so the noise of a shared machine
hits both sides alike.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent_ledger.stores._mysql_queries import EFFECT_COLUMNS as MYSQL_COLUMNS
from agent_ledger.stores._postgres_queries import EFFECT_COLUMNS as PG_COLUMNS
from agent_ledger.stores._sqlite_queries import FIND as SQLITE_FIND
from agent_ledger.stores.sqlite import SQLITE_MIGRATIONS, SQLITE_SCHEMA_SQL


async def handler(effect: object) -> dict[str, bool]:
    """The handler every scenario runs: trivial, so the ledger's cost shows."""
    return {"ok": True}


class PostgresFloor:
    """Raw psycopg through the ledger's own pool, on a copy of the ledger's table."""

    #: Fresh floor, step 1: insert-or-get with a dedup count, telling created from existing.
    INSERT = (
        "INSERT INTO {t} AS e (idem_key, workflow_id, tool, args_canonical, status)"
        " VALUES (%(k)s, 'bench', 'floor', '{{}}', 'processing')"
        " ON CONFLICT (idem_key) DO UPDATE SET dedup_count = e.dedup_count + 1"
        " RETURNING id, (xmax = 0)"
    )
    #: Fresh floor, step 2: the compare-and-set commit.
    UPDATE = (
        "UPDATE {t} SET status = 'succeeded', result = '{{\"ok\": true}}'::json,"
        " completed_at = clock_timestamp(), updated_at = clock_timestamp()"
        " WHERE id = %(id)s AND status = 'processing'"
    )
    #: Replay floor: the cheapest thing that can answer a duplicate, a read of
    #: the row by its unique key, of the columns the ledger reads.
    READ = "SELECT " + PG_COLUMNS + " FROM {t} WHERE idem_key = %(k)s"

    def __init__(self, pool: Any, table: str) -> None:
        self.pool = pool
        self.insert = self.INSERT.format(t=table)
        self.update = self.UPDATE.format(t=table)
        self.read = self.READ.format(t=table)

    async def fresh(self, key: str) -> None:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(self.insert, {"k": key})
            row = await cursor.fetchone()
        async with self.pool.connection() as conn:
            await conn.execute(self.update, {"id": row[0]})

    async def insert_or_read(self, key: str) -> None:
        """The one-statement ceiling: a single insert-or-read per call (step 1
        alone). A fresh run needs two durable statements (begin, then its
        outcome), so it can reach about half of this at best."""
        async with self.pool.connection() as conn:
            cursor = await conn.execute(self.insert, {"k": key})
            await cursor.fetchone()

    async def replay(self, key: str) -> None:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(self.read, {"k": key})
            await cursor.fetchone()


class SqliteFloor:
    """Raw sqlite3 on one dedicated thread, the way SqliteStore uses it."""

    def __init__(self, path: Path) -> None:
        self.executor = ThreadPoolExecutor(1)
        self.conn = self.executor.submit(self._open, path).result()

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.executescript(SQLITE_SCHEMA_SQL)
        # The later versions too: the replay floor reads every column the ledger reads.
        for script in SQLITE_MIGRATIONS.values():
            conn.executescript(script)
        return conn

    def _begin(self, key: str) -> str:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        cursor = conn.execute(
            "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
            " args_canonical, created_us, updated_us, heartbeat_us)"
            " VALUES (?, ?, 'bench', 'floor', 'processing', '{}', 0, 0, 0)"
            " ON CONFLICT (idem_key) DO NOTHING",
            (str(uuid.uuid4()), key),
        )
        if cursor.rowcount != 1:
            conn.execute(
                "UPDATE agent_ledger_effects SET dedup_count = dedup_count + 1 WHERE idem_key = ?",
                (key,),
            )
        row = conn.execute(
            "SELECT id, status, result FROM agent_ledger_effects WHERE idem_key = ?", (key,)
        ).fetchone()
        conn.execute("COMMIT")
        return str(row[0])

    def _read(self, key: str) -> None:
        self.conn.execute(SQLITE_FIND, (key,)).fetchone()

    def _commit(self, effect_id: str) -> None:
        self.conn.execute(
            "UPDATE agent_ledger_effects SET status = 'succeeded', result = '{\"ok\":true}',"
            " completed_us = 1, updated_us = 1 WHERE id = ? AND status = 'processing'",
            (effect_id,),
        )

    async def fresh(self, key: str) -> None:
        loop = asyncio.get_running_loop()
        effect_id = await loop.run_in_executor(self.executor, self._begin, key)
        await loop.run_in_executor(self.executor, self._commit, effect_id)

    async def replay(self, key: str) -> None:
        """The replay floor: a raw read of the row by its unique key, on the same thread."""
        await asyncio.get_running_loop().run_in_executor(self.executor, self._read, key)

    def close(self) -> None:
        self.executor.submit(self.conn.close).result()
        self.executor.shutdown()


class MySQLFloor:
    """Raw asyncmy through the store's own connections, on a copy of the ledger's table.

    The same statements a ledger step needs at least: begin's insert-or-read
    (MariaDB's INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING) and the
    fenced commit for a fresh run; for a replay, the read of the row by its
    unique key, of the columns the ledger reads. Each is given its values in
    order, so the driver runs it as a server-side prepared statement (the
    binary protocol), its fastest way and the one the store's steps use.
    """

    INSERT = (
        "INSERT INTO agent_ledger_floor (id, idem_key, workflow_id, tool, status, args_canonical,"
        " lease_ms, created_at, updated_at, heartbeat_at, history)"
        " VALUES (%s, %s, 'bench', 'floor', 'processing', '{}', 15000,"
        " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), '[]')"
        " ON DUPLICATE KEY UPDATE dedup_count = dedup_count + 1 RETURNING id"
    )
    UPDATE = (
        "UPDATE agent_ledger_floor FORCE INDEX (PRIMARY) SET status = 'succeeded',"
        " result = '{\"ok\": true}', completed_at = UTC_TIMESTAMP(6),"
        " updated_at = UTC_TIMESTAMP(6) WHERE id = %s AND status = 'processing'"
    )
    READ = "SELECT " + MYSQL_COLUMNS + " FROM agent_ledger_floor WHERE idem_key = %s"

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def fresh(self, key: str) -> None:
        async with self.pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(self.INSERT, (str(uuid.uuid4()), key))
            (effect_id,) = await cur.fetchone()
        async with self.pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(self.UPDATE, (effect_id,))

    async def replay(self, key: str) -> None:
        async with self.pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(self.READ, (key,))
            await cur.fetchone()
