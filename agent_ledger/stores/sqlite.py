"""SQLite store: the durable default for one machine, no server needed.

Built on the standard library's ``sqlite3`` with one dedicated thread per
store that owns the connection, rather than on aiosqlite: that is all
aiosqlite would give us (it also runs one thread per connection), it keeps
the runtime dependencies to orjson alone, and it leaves transaction control
(``BEGIN IMMEDIATE``) entirely in our hands.

Safe for many tasks and many processes on one machine: WAL journaling (readers
never block the writer), every read-modify-write step in a ``BEGIN IMMEDIATE``
transaction (it takes the write lock up front, so two processes can never both
decide they created or claimed an effect), and a busy timeout so contending
writers queue instead of failing. ``synchronous=FULL`` by default, so a
receipt that was committed survives a power cut, not just a crash.

Waiters in the same process are woken at once; waiters in other processes
poll (SQLite has no notifications). Every timestamp, and every staleness
judgement, comes from the store's clock read under the write lock: on one
machine all processes read the same system clock, and tests inject a
``ManualClock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import orjson

from agent_ledger.clock import Clock, utc_now
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import (
    EffectInFlightError,
    EffectLedgerError,
    EffectLedgerValidationError,
    EffectStoreError,
)
from agent_ledger.ids import is_effect_id, new_effect_id
from agent_ledger.observability import logger
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores import _sqlite_queries as q
from agent_ledger.stores._columns import ROW_COLUMNS
from agent_ledger.stores._dedup import (
    DEFAULT_FLUSH_INTERVAL_S,
    PendingCounts,
    check_flush_interval,
    plus_one,
    row_id,
)
from agent_ledger.stores._legacy import LegacyStoreMethods, all_effects
from agent_ledger.stores._params import (
    Dialect,
    begin_params,
    claim_params,
    commit_params,
    list_params,
    mark_started_params,
    park_params,
    record_try_params,
    release_params,
    reopen_params,
    retry_failed_params,
    settle_params,
    transition_params,
)
from agent_ledger.stores._rows import STATUS_BY_VALUE, effect_from_row, stats_from_groups
from agent_ledger.stores._sqlite_approvals import SqliteApprovals
from agent_ledger.stores._sqlite_budgets import SqliteBudgets
from agent_ledger.stores._sqlite_holders import Holders
from agent_ledger.stores._sqlite_sagas import SqliteSagas
from agent_ledger.stores._sqlite_tables import from_us, to_us
from agent_ledger.stores._subscriptions import Registration, Subscribers
from agent_ledger.stores._transactions import (
    LEASE_PAUSE_AFTER_MS,
    TransactionGate,
    TransactionHandle,
)
from agent_ledger.stores.base import (
    BeginOutcome,
    ClaimOutcome,
    Decision,
    EffectQuery,
    HeartbeatOutcome,
    Held,
    LedgerStats,
    NewEffect,
    SchemaMigration,
    check_commit_status,
    check_purge_statuses,
    check_settle_target,
    check_transition_target,
    transition_sources,
)

__all__ = [
    "SQLITE_MIGRATIONS",
    "SQLITE_SCHEMA_SQL",
    "SQLITE_SCHEMA_VERSION",
    "SqliteStore",
    "SqliteTransaction",
]

#: The schema this version of the library needs: the newest version its schema
#: files record in ``agent_ledger_schema_version`` (a test holds the two equal).
SQLITE_SCHEMA_VERSION: Final = 4

#: The SQLite schema; applied by ``SqliteStore`` when it opens a database.
SQLITE_SCHEMA_SQL: Final = (
    resources.files("agent_ledger.stores").joinpath("sqlite_schema.sql").read_text("utf-8")
)
#: The versions after 1, each applied once on top of the one before: the text
#: of ``sqlite_schema_<N>.sql`` by N.
SQLITE_MIGRATIONS: Final = {
    version: resources.files("agent_ledger.stores")
    .joinpath(f"sqlite_schema_{version}.sql")
    .read_text("utf-8")
    for version in range(2, SQLITE_SCHEMA_VERSION + 1)
}


def _refuse_newer(found: int, needed: int, where: str) -> None:
    """A schema newer than this library was migrated by a newer release: refuse it."""
    if found > needed:
        raise EffectStoreError(
            f"{where} has agent-ledger schema version {found}, newer than this library's "
            f"{needed}: a newer release migrated it. Upgrade agent-ledger to use it; this "
            "version would misread its rows.",
            operation="check_schema",
        )


def _apply_schema(conn: sqlite3.Connection) -> SchemaMigration:
    """Create version 1 if missing, then apply each later version the file lacks.

    All of it runs under the write lock (``BEGIN IMMEDIATE``) and reads the
    version again once it holds the lock, so processes opening (or
    migrating) an old file at once upgrade it exactly once, and each reports
    what it found; a failed upgrade rolls back and leaves the file as it was.
    A file already at this library's version is only read.
    """
    found = _version(conn)
    _refuse_newer(found, SQLITE_SCHEMA_VERSION, "the SQLite file")
    if found >= SQLITE_SCHEMA_VERSION:
        return SchemaMigration(found, found)
    conn.execute(q.TX_BEGIN)
    try:
        found = _version(conn)
        if found < 1:
            for statement in _statements(SQLITE_SCHEMA_SQL):
                conn.execute(statement)
        for version, script in SQLITE_MIGRATIONS.items():
            if _version(conn) < version:
                for statement in _statements(script):
                    conn.execute(statement)
        left = _version(conn)
        conn.execute(q.TX_COMMIT)
    except BaseException:
        conn.execute(q.TX_ROLLBACK)
        raise
    return SchemaMigration(found, left)


def _enter_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """Switch the file to WAL, waiting up to the busy timeout for other openers.

    The switch needs the file to itself, and SQLite does not always apply the
    busy timeout to it: processes opening a new (or pre-WAL) file together
    got "database is locked". Once one of them has switched, the rest find
    WAL already on.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            conn.execute(q.JOURNAL_MODE)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _version(conn: sqlite3.Connection) -> int:
    """The file's schema version; 0 when it has no agent-ledger tables yet."""
    if conn.execute(q.HAS_VERSIONS_TABLE).fetchone() is None:
        return 0
    row = conn.execute(q.SCHEMA_VERSION).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def _statements(script: str) -> Iterator[str]:
    # executescript would commit the open transaction first (Python < 3.12),
    # so a migration runs statement by statement; sqlite3 itself says where
    # each one ends.
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete statement at the end of a migration: {pending!r}")


_T = TypeVar("_T")
_PROCESSING: Final = EffectStatus.PROCESSING.value
_STATUS_BY_VALUE: Final = STATUS_BY_VALUE
_STATUS: Final = ROW_COLUMNS.index("status")
_ID: Final = ROW_COLUMNS.index("id")
_ATTEMPT: Final = ROW_COLUMNS.index("attempt")
_LEASE_MS: Final = ROW_COLUMNS.index("lease_ms")
#: A duplicate of an effect in one of these is only read by begin, and counted later.
_FINISHED: Final = frozenset(s.value for s in TERMINAL)
#: A flush of duplicate counts waits at most this long for the write lock.
_FLUSH_BUSY_TIMEOUT_MS: Final = 100


def _begin_write(conn: sqlite3.Connection, wait_ms: int | None, busy_ms: int, key: str) -> None:
    """``BEGIN IMMEDIATE``, waiting for another connection's write lock at most
    ``wait_ms`` when that is shorter than the store's ``busy_ms`` (a caller's
    ``lock_timeout_ms``, see "Lock waits" in ``stores.base``): past it
    ``EffectInFlightError`` about ``key``, and nothing was done. The busy timeout
    is set for this statement alone (two PRAGMAs, only when the bound is shorter)."""
    if wait_ms is None or wait_ms >= busy_ms:
        conn.execute(q.TX_BEGIN)
        return
    conn.execute(q.BUSY_TIMEOUT.format(ms=wait_ms))
    try:
        conn.execute(q.TX_BEGIN)
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
            raise
        raise EffectInFlightError(key, None, lock_timeout_ms=wait_ms) from None
    finally:
        conn.execute(q.BUSY_TIMEOUT.format(ms=busy_ms))


def _error_columns(error: EffectError | None) -> dict[str, object]:
    # has_error: a transition keeps the stored error unless given a new one.
    return {
        "has_error": error is not None,
        "error_message": error.message if error is not None else None,
        "error_code": error.code if error is not None else None,
    }


def _status_array(statuses: Iterable[EffectStatus]) -> str:
    # A JSON array, which the statements read with json_each.
    return orjson.dumps(sorted(s.value for s in statuses)).decode()


_DIALECT: Final = Dialect(statuses=_status_array, error=_error_columns, moment=to_us)


def _effect_from_row(row: tuple[Any, ...]) -> Effect:
    return effect_from_row(row, from_us)


class SqliteTransaction(TransactionHandle):
    """Handle from ``SqliteStore.transaction()``, to pass as ``tx``."""

    #: When its BEGIN took the write lock (store clock, µs); None until then.
    opened_us: int | None = None


class SqliteStore(LegacyStoreMethods, SqliteSagas, SqliteBudgets, SqliteApprovals):
    """Effects in a SQLite file, durable and shared by every process on the machine.

    ``path`` is the database file (``":memory:"`` is refused: use
    MemoryStore). With ``create=False`` a missing file or schema raises
    ``EffectStoreError`` instead of being created. Opening connects on the
    store's own thread and waits for it: the constructor may block briefly,
    like opening a file.

    Duplicates are counted in memory and written every
    ``dedup_flush_interval_s`` seconds in one statement for all keys, on
    :meth:`flush_counts` and on :meth:`close`, so that a replay is one read
    that never takes the write lock (``stores/_dedup.py`` says what a reader
    sees and what a crash may lose).
    """

    #: How settle's parameters are spelled here (for the approval steps' ``decide``).
    _dialect = _DIALECT

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = utc_now,
        create: bool = True,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout_ms: int = 30_000,
        dedup_flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> None:
        if str(path) in ("", ":memory:"):
            raise EffectLedgerValidationError(
                "SqliteStore needs a file path; use MemoryStore for an in-memory ledger",
                field="path",
            )
        if synchronous not in ("FULL", "NORMAL"):
            raise EffectLedgerValidationError(
                f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}", field="synchronous"
            )
        interval_s = check_flush_interval(dedup_flush_interval_s)
        self.path = Path(path)
        self._clock = clock
        self._busy_timeout_ms = int(busy_timeout_ms)
        #: How long a flush waits for the write lock (``close()`` raises it).
        self._flush_wait_ms = _FLUSH_BUSY_TIMEOUT_MS
        self._counts = PendingCounts(
            self._write_counts, interval_s=interval_s, store=f"SqliteStore({self.path})"
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="agent-ledger-sqlite")
        self._subscribers = Subscribers()
        self._gate = TransactionGate(self, SqliteTransaction, "SqliteStore", self._subscribers)
        self._closed = False
        #: The holders' second heartbeat, outside the database (_sqlite_holders).
        self._holders = Holders(self.path, lambda: to_us(self._clock()))
        opener = functools.partial(self._open, create, synchronous, busy_timeout_ms)
        try:
            self._conn: sqlite3.Connection = self._executor.submit(opener).result()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        self._holders.open()

    def _open(self, create: bool, synchronous: str, busy_timeout_ms: int) -> sqlite3.Connection:
        with self._errors("open"):
            if not create and not self.path.exists():
                raise EffectStoreError(
                    f"no ledger database at {self.path}: run "
                    f"`agent-ledger init --url sqlite:///{self.path}` first",
                    operation="open",
                )
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves.
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=busy_timeout_ms / 1000,
            )
            try:
                conn.execute(q.BUSY_TIMEOUT.format(ms=int(busy_timeout_ms)))
                _enter_wal(conn, busy_timeout_ms)
                conn.execute(q.SYNCHRONOUS.format(level=synchronous))
                if create:
                    _apply_schema(conn)
                elif conn.execute(q.HAS_EFFECTS_TABLE).fetchone() is None:
                    raise EffectStoreError(
                        f"{self.path} has no agent-ledger tables: run `agent-ledger init` first",
                        operation="open",
                    )
            except BaseException:
                conn.close()
                raise
            return conn

    # -- schema -----------------------------------------------------------------

    async def create_schema(self) -> None:
        """Create the tables, or upgrade them to this library's version (idempotent).

        Opening with ``create=True``, the default, has already done it; this
        is for a store opened with ``create=False``. ``migrate()`` does the
        same and says what it did.
        """
        await self._migrate("create_schema")

    async def migrate(self) -> SchemaMigration:
        """Create or upgrade the tables (see ``Store.migrate``); what version it found and left.

        Opening with ``create=True``, the default, already migrates: open
        with ``create=False`` to see what a migration does.
        """
        return await self._migrate("migrate")

    async def _migrate(self, operation: str) -> SchemaMigration:
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> SchemaMigration:
            return _apply_schema(conn)

        # write=False: _apply_schema takes the write lock itself, only if it must.
        return await self._run(operation, work, None, write=False)

    async def check_schema(self) -> int:
        """The schema version in the file; raises with a fix if it is missing or old."""
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> int | None:
            row = conn.execute(q.SCHEMA_VERSION).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        version = await self._run("check_schema", work, None, write=False)
        if version is not None:
            _refuse_newer(version, SQLITE_SCHEMA_VERSION, str(self.path))
        if version is None or version < SQLITE_SCHEMA_VERSION:
            fix = (
                f"run `agent-ledger init --url sqlite:///{self.path}` "
                "(or await store.create_schema())"
                if version is None
                else "run `agent-ledger migrate` (or await store.migrate())"
            )
            raise EffectStoreError(
                f"{self.path} has agent-ledger schema version {version}, this library needs "
                f"{SQLITE_SCHEMA_VERSION}: {fix}",
                operation="check_schema",
            )
        return version

    # -- plumbing ---------------------------------------------------------------

    @contextmanager
    def _errors(
        self, operation: str, *, idem_key: str | None = None, effect_id: str | None = None
    ) -> Iterator[None]:
        """The one place sqlite3 errors become ``EffectStoreError``."""
        try:
            yield
        except EffectLedgerError:
            raise
        except sqlite3.Error as exc:
            message = f"{type(exc).__name__}: {exc}"
            if "no such table" in str(exc):
                message = f"{self.path} has no agent-ledger tables: run `agent-ledger init` first"
            raise EffectStoreError(
                message,
                operation=operation,
                idem_key=idem_key,
                effect_id=effect_id,
                # SQLITE_TOOBIG: a value over the connection's length limit.
                too_long=isinstance(exc, sqlite3.DataError) or "too big" in str(exc),
            ) from exc

    async def _enter(
        self, tx: object | None, lock_timeout_ms: int | None = None, idem_key: str = ""
    ) -> SqliteTransaction | None:
        if self._closed:
            raise EffectStoreError("the store is closed", operation="use")
        # The connection is shared: while a transaction is open on it, any other
        # statement would join that transaction, so the gate makes it wait.
        return await self._gate.enter(tx, lock_timeout_ms=lock_timeout_ms, idem_key=idem_key)

    async def _run(
        self,
        operation: str,
        work: Callable[[sqlite3.Connection, int], _T],
        tx: SqliteTransaction | None,
        *,
        write: bool,
        idem_key: str | None = None,
        effect_id: str | None = None,
        lock_timeout_ms: int | None = None,
    ) -> _T:
        """Run ``work(conn, now_us)`` on the store's thread, atomically.

        Outside a caller's transaction a writing step runs in its own
        ``BEGIN IMMEDIATE`` transaction, so it holds the write lock from its
        first read: the clock is read under that lock too. It waits for the
        lock at most ``lock_timeout_ms`` when given (``_begin_write``).
        """

        def job() -> _T:
            with self._errors(operation, idem_key=idem_key, effect_id=effect_id):
                if tx is not None or not write:
                    return work(self._conn, to_us(self._clock()))
                _begin_write(self._conn, lock_timeout_ms, self._busy_timeout_ms, idem_key or "")
                try:
                    result = work(self._conn, to_us(self._clock()))
                    self._conn.execute(q.TX_COMMIT)
                except BaseException:
                    # A failed COMMIT too: it leaves the transaction open, and
                    # with it the write lock, for every later step to trip on.
                    _roll_back(self._conn)
                    raise
                return result

        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    # -- ledger steps -----------------------------------------------------------

    async def begin(
        self, new: NewEffect, *, tx: object | None = None, lock_timeout_ms: int | None = None
    ) -> BeginOutcome:
        key = new.idem_key
        stx = await self._enter(tx, lock_timeout_ms, key)
        counts = self._counts
        busy_ms = self._busy_timeout_ms
        started = counts.epoch
        clock = self._clock
        holders = self._holders

        def insert_or_get(conn: sqlite3.Connection, now: int) -> tuple[tuple[Any, ...], bool]:
            # Built here, on the store's thread, and only when the key may be new:
            # a replay of a finished effect never gets this far.
            params = {**begin_params(new), "id": new_effect_id(), "now": now}
            created = conn.execute(q.INSERT, params).rowcount == 1
            if created and params["executions"]:
                # Processing: its holder's file, before the insert commits.
                holders.hold((str(params["id"]), 1), new.lease_ms)
            elif not created and stx is None:  # with tx: only read (Store.begin)
                conn.execute(q.COUNT_DUPLICATE, params)
            return conn.execute(q.FIND, (key,)).fetchone(), created

        def work(conn: sqlite3.Connection, now: int) -> tuple[tuple[Any, ...], bool, bool]:
            """(row, created, replayed): one job, so one hop to the store's thread."""
            if stx is not None:
                return (*insert_or_get(conn, now), False)
            # A replay of a finished effect: this read alone, as a WAL reader,
            # without the write lock (see "begin" in _sqlite_queries).
            found: tuple[Any, ...] | None = conn.execute(q.FIND, (key,)).fetchone()
            if found is not None and found[_STATUS] in _FINISHED:
                return found, False, True
            _begin_write(conn, lock_timeout_ms, busy_ms, key)
            try:
                # The clock under the write lock, as every writing step reads it.
                outcome = insert_or_get(conn, to_us(clock()))
                conn.execute(q.TX_COMMIT)
            except BaseException:
                _roll_back(conn)
                raise
            return (*outcome, False)

        # write=False: the job takes the write lock itself, only when it must.
        row, created, replayed = await self._run("begin", work, stx, write=False, idem_key=key)
        if created:
            return BeginOutcome(_effect_from_row(row), True)  # created
        if stx is None and not counts.ambiguous((row,), started):
            row = counts.overlay(row)  # _counted's answer, without its two frames
        else:
            (row,) = await self._counted([row], started, stx)
        if replayed:
            # Counted once the answer is certain: a replay that raises counts nothing.
            counts.add(row_id(row))
            row = plus_one(row)
        return BeginOutcome(_effect_from_row(row), False)

    async def claim(
        self,
        idem_key: str,
        *,
        stale_after_ms: int,
        lease_ms: int | None = None,
        tx: object | None = None,
        lock_timeout_ms: int | None = None,
    ) -> ClaimOutcome:
        stx = await self._enter(tx, lock_timeout_ms, idem_key)
        params = claim_params(_DIALECT, idem_key, stale_after_ms=stale_after_ms, lease_ms=lease_ms)
        started = self._counts.epoch

        holders = self._holders

        def work(conn: sqlite3.Connection, now: int) -> tuple[tuple[Any, ...] | None, bool]:
            held = _holding(conn, idem_key)
            params["now"], params["seen_us"] = now, 0 if held is None else holders.seen_us(held)
            claimed = conn.execute(q.CLAIM, params).rowcount == 1
            row: tuple[Any, ...] | None = conn.execute(q.FIND, (idem_key,)).fetchone()
            if claimed and row is not None:
                holders.hold((row[_ID], row[_ATTEMPT]), row[_LEASE_MS])
                if held is not None:
                    # The previous holder's file: it is fenced off now.
                    holders.remove(held, ours=False)
            return row, claimed

        row, claimed = await self._run(
            "claim", work, stx, write=True, idem_key=idem_key, lock_timeout_ms=lock_timeout_ms
        )
        if claimed:
            self._gate.changed(idem_key, stx)
        if row is None:
            return ClaimOutcome(None, claimed=claimed)
        return ClaimOutcome(await self._one_counted(row, started, stx), claimed=claimed)

    async def heartbeat(self, held: Sequence[Held]) -> HeartbeatOutcome:
        batch = [one for one in held if is_effect_id(one.effect_id)]
        # Before any wait: neither the write lock nor this store's gate (a
        # transaction of this process waiting for another process's lock holds
        # it) may keep this sign of life back; it needs neither.
        self._holders.alive((one.effect_id, one.attempt) for one in batch)
        await self._enter(None)
        if not batch:
            return HeartbeatOutcome(frozenset())

        def work(conn: sqlite3.Connection, now: int) -> HeartbeatOutcome:
            # One job and one write transaction for the whole batch; a
            # single-row UPDATE per effect is as fast here as any set-based
            # form, since every statement runs inside this process.
            params: dict[str, object] = {"processing": _PROCESSING, "now": now}
            refreshed = []
            for one in batch:
                params["id"], params["attempt"] = one
                if conn.execute(q.HEARTBEAT, params).rowcount == 1:
                    refreshed.append(one)
            return HeartbeatOutcome(frozenset(refreshed))

        effect_id = batch[0].effect_id if len(batch) == 1 else None
        return await self._run("heartbeat", work, None, write=True, effect_id=effect_id)

    async def commit(
        self,
        effect_id: str,
        *,
        attempt: int | None,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None = None,
        ends_try: bool = True,
        usage_json: str | None = None,
        started: bool = True,
        retryable: bool = False,
    ) -> bool:
        check_commit_status(status)
        write = functools.partial(
            self._commit,
            effect_id,
            attempt,
            status,
            result_json,
            error,
            tx,
            ends_try,
            usage_json,
            started,
            retryable,
        )
        if attempt is None:
            return await write()
        # The holder is alive until its outcome is stored, however long the
        # commit waits for the write lock; then the holding is over.
        holding = (effect_id, attempt)
        done = self._holders.under_way(holding)
        try:
            won = await write()
        finally:
            done()
        self._holders.remove(holding)
        return won

    async def _commit(
        self,
        effect_id: str,
        attempt: int | None,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None,
        ends_try: bool,
        usage_json: str | None,
        started: bool,
        retryable: bool = False,
    ) -> bool:
        stx = await self._enter(tx)
        if not is_effect_id(effect_id):
            return False

        params = commit_params(
            _DIALECT,
            effect_id,
            attempt=attempt,
            status=status,
            result_json=result_json,
            error=error,
            ends_try=ends_try,
            usage_json=usage_json,
            started=started,
            retryable=retryable,
        )
        return await self._set("commit", q.COMMIT, params, effect_id, stx)

    async def record_try(
        self, effect_id: str, *, attempt: int, error: EffectError, error_type: str
    ) -> bool:
        self._holders.alive(((effect_id, attempt),))
        await self._enter(None)
        if not is_effect_id(effect_id):
            return False
        params = record_try_params(effect_id, attempt=attempt, error=error, error_type=error_type)

        def work(conn: sqlite3.Connection, now: int) -> bool:
            params["now"], params["at"] = now, from_us(now).isoformat()
            return bool(conn.execute(q.RECORD_TRY, params).rowcount == 1)

        return await self._run("record_try", work, None, write=True, effect_id=effect_id)

    async def release(self, effect_id: str, *, attempt: int, for_approval: bool = False) -> bool:
        holding = (effect_id, attempt)
        done = self._holders.under_way(holding)
        try:
            released = await self._release(effect_id, attempt, for_approval)
        finally:
            done()
        self._holders.remove(holding)
        return released

    async def _release(self, effect_id: str, attempt: int, for_approval: bool) -> bool:
        await self._enter(None)
        if not is_effect_id(effect_id):
            return False

        params = release_params(effect_id, attempt=attempt, for_approval=for_approval)
        return await self._set("release", q.RELEASE, params, effect_id, None)

    async def _set(
        self,
        operation: str,
        statement: str,
        params: dict[str, Any],
        effect_id: str,
        stx: SqliteTransaction | None,
    ) -> bool:
        """Run ``statement``, a compare-and-set on the row of ``effect_id`` (``:now``: the
        store's clock); True if it applied, and then its key's waiters are told."""

        def work(conn: sqlite3.Connection, now: int) -> str | None:
            params["now"] = now
            if conn.execute(statement, params).rowcount != 1:
                return None
            return str(conn.execute(q.KEY_OF, (effect_id,)).fetchone()[0])

        idem_key = await self._run(operation, work, stx, write=True, effect_id=effect_id)
        if idem_key is None:
            return False
        self._gate.changed(idem_key, stx)
        return True

    async def transition(
        self,
        idem_key: str,
        *,
        target: EffectStatus,
        error: EffectError | None = None,
        decision: Decision | None = None,
        tx: object | None = None,
        sources: frozenset[EffectStatus] | None = None,
    ) -> Effect | None:
        check_transition_target(target)
        allowed = transition_sources(target, sources)
        stx = await self._enter(tx)
        params = transition_params(
            _DIALECT, idem_key, target=target, error=error, decision=decision, sources=allowed
        )
        return await self._move("transition", q.TRANSITION, params, idem_key, stx)

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> Effect | None:
        await self._enter(None)
        params = reopen_params(_DIALECT, idem_key, by=by, reason=reason)
        return await self._move("reopen", q.REOPEN, params, idem_key, None)

    async def retry_failed(self, idem_key: str, *, attempt: int, lease_ms: int) -> ClaimOutcome:
        await self._enter(None)
        params = retry_failed_params(_DIALECT, idem_key, attempt=attempt, lease_ms=lease_ms)
        started = self._counts.epoch
        holders = self._holders

        def work(conn: sqlite3.Connection, now: int) -> tuple[tuple[Any, ...] | None, bool]:
            params["now"] = now
            claimed = conn.execute(q.RETRY_FAILED, params).rowcount == 1
            row: tuple[Any, ...] | None = conn.execute(q.FIND, (idem_key,)).fetchone()
            if claimed and row is not None:
                holders.hold((row[_ID], row[_ATTEMPT]), row[_LEASE_MS])
            return row, claimed

        row, claimed = await self._run("retry_failed", work, None, write=True, idem_key=idem_key)
        if claimed:
            self._gate.changed(idem_key, None)
        if row is None:
            return ClaimOutcome(None, claimed=claimed)
        return ClaimOutcome(await self._one_counted(row, started, None), claimed=claimed)

    async def mark_started(
        self, effect_id: str, *, attempt: int, worker: str, tx: object | None = None
    ) -> bool:
        self._holders.alive(((effect_id, attempt),))
        stx = await self._enter(tx)
        if not is_effect_id(effect_id):
            return False
        params = mark_started_params(effect_id, attempt=attempt, worker=worker)

        def work(conn: sqlite3.Connection, now: int) -> bool:
            params["now"] = now
            return bool(conn.execute(q.MARK_STARTED, params).rowcount == 1)

        return await self._run("mark_started", work, stx, write=True, effect_id=effect_id)

    async def park(self, idem_key: str, *, stale_after_ms: int, error: EffectError) -> ClaimOutcome:
        await self._enter(None)
        params = park_params(_DIALECT, idem_key, stale_after_ms=stale_after_ms, error=error)
        started = self._counts.epoch

        holders = self._holders

        def work(conn: sqlite3.Connection, now: int) -> tuple[tuple[Any, ...] | None, bool]:
            held = _holding(conn, idem_key)
            params["now"], params["at"] = now, from_us(now).isoformat()
            params["seen_us"] = 0 if held is None else holders.seen_us(held)
            parked = conn.execute(q.PARK, params).rowcount == 1
            if parked and held is not None:
                holders.remove(held, ours=False)
            return conn.execute(q.FIND, (idem_key,)).fetchone(), parked

        row, parked = await self._run("park", work, None, write=True, idem_key=idem_key)
        if parked:
            self._gate.changed(idem_key, None)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        return ClaimOutcome(await self._one_counted(row, started, None), claimed=parked)

    async def settle(
        self,
        idem_key: str,
        *,
        target: EffectStatus,
        decision: Decision,
        expected_attempt: int | None = None,
        only_parked: bool = False,
        result_json: str | None = None,
        error: EffectError | None = None,
    ) -> Effect | None:
        check_settle_target(target)
        await self._enter(None)
        params = settle_params(
            _DIALECT,
            idem_key,
            target=target,
            expected_attempt=expected_attempt,
            only_parked=only_parked,
            result_json=result_json,
            error=error,
            decision=decision,
        )
        return await self._move("settle", q.SETTLE, params, idem_key, None)

    async def _move(
        self,
        operation: str,
        statement: str,
        params: dict[str, Any],
        idem_key: str,
        stx: SqliteTransaction | None,
    ) -> Effect | None:
        """Run ``statement``, a compare-and-set on ``idem_key``'s row, and read the row
        back in the same write; None when it did not apply (nothing changed).

        ``:now`` is the store's clock in microseconds and ``:at`` the same moment
        as ISO text, for the history entry a statement may append.
        """
        started = self._counts.epoch

        def work(conn: sqlite3.Connection, now: int) -> tuple[Any, ...] | None:
            params["now"], params["at"] = now, from_us(now).isoformat()
            if conn.execute(statement, params).rowcount != 1:
                return None
            row: tuple[Any, ...] = conn.execute(q.FIND, (idem_key,)).fetchone()
            return row

        moved = await self._run(operation, work, stx, write=True, idem_key=idem_key)
        if moved is None:
            return None
        self._gate.changed(idem_key, stx)
        return await self._one_counted(moved, started, stx)

    async def get(self, effect_id: str, *, tx: object | None = None) -> Effect | None:
        stx = await self._enter(tx)
        if not is_effect_id(effect_id):
            return None
        started = self._counts.epoch

        def work(conn: sqlite3.Connection, now: int) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(q.GET, (effect_id,)).fetchone()
            return row

        row = await self._run("get", work, stx, write=False, effect_id=effect_id)
        return None if row is None else await self._one_counted(row, started, stx)

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        stx = await self._enter(tx)
        started = self._counts.epoch
        row = await self._run("find", _find_row(idem_key), stx, write=False, idem_key=idem_key)
        return None if row is None else await self._one_counted(row, started, stx)

    async def find_legacy(self, legacy_key: str, *, tx: object | None = None) -> Effect | None:
        stx = await self._enter(tx)
        started = self._counts.epoch

        def work(conn: sqlite3.Connection, now: int) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(q.FIND_LEGACY, (legacy_key,)).fetchone()
            return row

        row = await self._run("find_legacy", work, stx, write=False)
        return None if row is None else await self._one_counted(row, started, stx)

    async def record_legacy(self, legacy_key: str, idem_key: str) -> bool:
        """As ``MemoryStore.record_legacy``: map 0.2.x's key to ours; False if mapped already."""
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> bool:
            return conn.execute(q.RECORD_LEGACY, (legacy_key, idem_key)).rowcount == 1

        return await self._run("record_legacy", work, None, write=True)

    # -- audit --------------------------------------------------------------------

    async def list_effects(self, query: EffectQuery | None = None) -> list[Effect]:
        if query is None:
            return await all_effects(self)  # 0.2.x's bare call
        await self._enter(None)
        names, params = list_params(_DIALECT, query)
        filters = [q.LIST_FILTERS[name] for name in names]
        # Only fixed fragments are joined; every value is a parameter.
        statement = q.LIST + (" WHERE " + " AND ".join(filters) if filters else "") + q.LIST_ORDER
        started = self._counts.epoch

        def work(conn: sqlite3.Connection, now: int) -> list[tuple[Any, ...]]:
            # :now is the store's clock, for the handler time of running effects.
            return conn.execute(statement, params | {"now": now}).fetchall()

        rows = await self._run("list_effects", work, None, write=False)
        return [_effect_from_row(row) for row in await self._counted(rows, started, None)]

    async def stats(self) -> LedgerStats:
        """Counts over the table; its ``duplicates`` include this process's counts.

        It first tries to write the pending duplicate counts (so other processes
        see them too). A read must answer even while another connection holds
        the write lock, so if that write fails the counts stay pending and are
        added to the totals instead: those of effects still stored, read after
        the totals (an effect purged in between is left out: low, never high).
        """
        with contextlib.suppress(EffectStoreError):
            await self.flush_counts()
        await self._enter(None)
        counts = self._counts
        async with counts.quiet():
            unwritten = counts.snapshot()
            ids = orjson.dumps(list(unwritten)).decode()

            def work(
                conn: sqlite3.Connection, now: int
            ) -> tuple[list[tuple[str, str, int, int]], list[tuple[str, int]]]:
                # The totals first, then which pending effects exist: never high.
                totals = conn.execute(q.STATS).fetchall()
                return totals, conn.execute(q.DEDUP_COUNTS, (ids,)).fetchall() if unwritten else []

            rows, stored = await self._run("stats", work, None, write=False)
        totals = stats_from_groups((_STATUS_BY_VALUE[st], tool, n, d) for st, tool, n, d in rows)
        extra = sum(unwritten[effect_id] for effect_id, _ in stored)
        return dataclasses.replace(totals, duplicates=totals.duplicates + extra)

    async def purge(self, *, older_than: timedelta, statuses: frozenset[EffectStatus]) -> int:
        check_purge_statuses(statuses)
        await self._enter(None)
        names = _status_array(statuses)

        holders = self._holders

        def work(conn: sqlite3.Connection, now: int) -> int:
            cutoff = now - older_than // timedelta(microseconds=1)
            purged: int = conn.execute(q.PURGE, {"statuses": names, "cutoff": cutoff}).rowcount
            # Under the write lock, so every holding's insert or claim has
            # committed: the files of holdings that are over go (dead holders').
            holders.sweep(functools.partial(_still_held, conn))
            return purged

        return await self._run("purge", work, None, write=True)

    # -- duplicate counts ---------------------------------------------------------

    async def flush_counts(self) -> None:
        """Write every duplicate this store counted so far, in one statement, now.

        Every other process then sees them (this one always does). Raises
        ``EffectStoreError`` if the write failed; the counts stay pending for
        the next flush. The write waits for the write lock at most 100 ms (or
        ``busy_timeout_ms`` if shorter): it shares the store's one thread
        with every read, and a replay must not wait behind another process's
        long write for a statistic (``close()`` waits up to ``busy_timeout_ms``).
        Cancelling the caller does not cancel the write.
        """
        # The write waits for an open transaction of this store, so the task
        # holding one must not wait for the write.
        self._gate.refuse_inside()
        await self._counts.flush()

    async def _write_counts(self, batch: Mapping[str, int]) -> tuple[str, ...]:
        await self._enter(None)
        text = orjson.dumps(batch).decode()
        wait_ms = min(self._busy_timeout_ms, self._flush_wait_ms)

        def work(conn: sqlite3.Connection, now: int) -> tuple[str, ...]:
            conn.execute(q.BUSY_TIMEOUT.format(ms=wait_ms))
            try:
                conn.execute(q.TX_BEGIN)
            finally:
                conn.execute(q.BUSY_TIMEOUT.format(ms=self._busy_timeout_ms))
            try:
                conn.execute(q.DEDUP_FLUSH, {"batch": text})
                conn.execute(q.TX_COMMIT)
            except BaseException:
                _roll_back(conn)
                raise
            # Before any later job on this thread reads: see overlay_unshared.
            self._counts.inflight_committed = True
            return ()

        return await self._run("flush_counts", work, None, write=False)

    async def _counted(
        self, rows: list[tuple[Any, ...]], started: int, tx: SqliteTransaction | None
    ) -> list[tuple[Any, ...]]:
        """``rows`` with this process's unwritten duplicates counted (``PendingCounts.counted``).

        Inside this store's own transaction a read never waits for a flush (the
        flush waits for the transaction): ``overlay_unshared`` counts it exactly.
        """
        counts = self._counts
        if tx is not None and counts.ambiguous(rows, started):
            return [counts.overlay_unshared(row) for row in rows]
        return await counts.counted(rows, started, self._read_counts, tx)

    async def _read_counts(self, ids: list[str], tx: SqliteTransaction | None) -> dict[str, int]:
        """The stored ``dedup_count`` of each of ``ids`` that still exists."""
        return await self._run("get", _stored_counts(orjson.dumps(ids).decode()), tx, write=False)

    async def _one_counted(
        self, row: tuple[Any, ...], started: int, tx: SqliteTransaction | None
    ) -> Effect:
        (row,) = await self._counted([row], started, tx)
        return _effect_from_row(row)

    # -- transactions and notifications -------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqliteTransaction]:
        """``BEGIN IMMEDIATE ... COMMIT`` around the block; other steps of this store wait.

        However the block ends short of a successful COMMIT (an error, a failed
        COMMIT, a cancellation at any await), the transaction is rolled back
        and the write lock released. A cancellation does not wait for that: a
        statement the store's thread has started (a ``BEGIN IMMEDIATE`` still
        waiting for the lock, say) cannot be interrupted, so the rollback is
        queued behind it on the same thread, ahead of any later step. A
        cancellation that arrives while COMMIT runs leaves the outcome to the
        COMMIT: the block may have been committed.
        """
        await self._enter(None)
        async with self._gate.lock:
            tx = SqliteTransaction(self)
            self._gate.open(tx)
            try:
                await self._run("transaction", _begin_transaction(tx), tx, write=False)
                yield tx
                await self._run("transaction", _commit_or_roll_back(tx), tx, write=False)
            except asyncio.CancelledError:
                self._end_transaction(tx)
                raise
            except BaseException:
                # Wait for the rollback, so whoever handles the error finds the
                # lock released; a second cancellation only stops the waiting.
                await asyncio.shield(asyncio.wrap_future(self._end_transaction(tx)))
                raise
            finally:
                self._gate.close(tx)
        self._gate.committed(tx)

    def _end_transaction(self, tx: SqliteTransaction) -> Future[None]:
        """Queue a rollback of whatever transaction the connection is in, if any.

        Submitted without an await, so no cancellation can come between the
        decision and the queueing; the store's one thread runs jobs in order,
        so it runs after every statement already queued (the BEGIN, COMMIT or
        statement a cancelled caller stopped waiting for) and before any later
        step. Its own failure is logged: nobody may be waiting for it.
        """

        def job() -> None:
            conn = self._conn
            if tx.opened_us is not None and conn.in_transaction:
                # Undo the block but keep the write lock until the leases are
                # paused: no other process can claim in between.
                try:
                    conn.execute(q.TX_UNDO_BLOCK)
                    _pause_leases(conn, tx.opened_us, to_us(self._clock()))
                    conn.execute(q.TX_COMMIT)
                    return
                except sqlite3.Error:
                    logger.warning("undoing a transaction's block failed; rolling back whole")
            _roll_back(conn)

        done = self._executor.submit(job)
        done.add_done_callback(_log_failed_rollback)
        return done

    def subscribe(self, idem_key: str) -> Registration:
        return self._subscribers.subscribe(idem_key)

    async def close(self) -> None:
        """Write the pending duplicate counts, close the connection and stop the
        store's thread.

        The write waits for the write lock up to ``busy_timeout_ms`` (not the
        100 ms of other flushes). A failure to write the counts is logged, not
        raised, and loses them: call :meth:`flush_counts` first to see it.
        """
        if self._closed:
            return
        # The flush and the thread's shutdown wait for an open transaction:
        # from inside its block they would wait for ever.
        self._gate.refuse_inside()
        # The last write: worth waiting for the lock as long as any step does,
        # rather than dropping the counts after 100 ms.
        self._flush_wait_ms = self._busy_timeout_ms
        await self._counts.close()
        self._closed = True
        self._holders.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)


def _holding(conn: sqlite3.Connection, idem_key: str) -> tuple[str, int] | None:
    """The (id, attempt) holding ``idem_key`` now, if it is processing."""
    found = conn.execute(q.HOLDING, (idem_key, _PROCESSING)).fetchone()
    return None if found is None else (str(found[0]), int(found[1]))


def _still_held(
    conn: sqlite3.Connection, holdings: Iterable[tuple[str, int]]
) -> set[tuple[str, int]]:
    text = orjson.dumps([list(h) for h in holdings]).decode()
    rows = conn.execute(q.STILL_HELD, {"holdings": text, "processing": _PROCESSING}).fetchall()
    return {(str(effect_id), int(attempt)) for effect_id, attempt in rows}


def _find_row(idem_key: str) -> Callable[[sqlite3.Connection, int], tuple[Any, ...] | None]:
    def work(conn: sqlite3.Connection, now: int) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = conn.execute(q.FIND, (idem_key,)).fetchone()
        return row

    return work


def _stored_counts(ids: str) -> Callable[[sqlite3.Connection, int], dict[str, int]]:
    def work(conn: sqlite3.Connection, now: int) -> dict[str, int]:
        return dict(conn.execute(q.DEDUP_COUNTS, (ids,)).fetchall())

    return work


def _roll_back(conn: sqlite3.Connection) -> None:
    """End the connection's transaction, if it is in one, without committing it."""
    if conn.in_transaction:
        conn.execute(q.TX_ROLLBACK)


def _begin_transaction(tx: SqliteTransaction) -> Callable[[sqlite3.Connection, int], None]:
    def work(conn: sqlite3.Connection, now: int) -> None:
        conn.execute(q.TX_BEGIN)
        conn.execute(q.TX_BLOCK)
        tx.opened_us = now

    return work


def _commit_or_roll_back(tx: SqliteTransaction) -> Callable[[sqlite3.Connection, int], None]:
    """COMMIT, pausing other holders' leases for as long as the transaction held
    the lock; if that fails, roll back (a failed COMMIT leaves the transaction open)."""

    def work(conn: sqlite3.Connection, now: int) -> None:
        try:
            if tx.opened_us is not None:
                _pause_leases(conn, tx.opened_us, now)
            conn.execute(q.TX_COMMIT)
        except BaseException:
            _roll_back(conn)
            raise

    return work


def _pause_leases(conn: sqlite3.Connection, opened_us: int, now_us: int) -> None:
    """Nobody could heartbeat while a transaction held the write lock: move the
    heartbeat of every effect held since before it by its duration (see
    ``_transactions``). Inside the transaction when it commits, on its own
    after a rollback (the lock was held either way)."""
    held_us = now_us - opened_us
    if held_us >= LEASE_PAUSE_AFTER_MS * 1000:
        params = {"held_us": held_us, "opened_us": opened_us, "processing": _PROCESSING}
        conn.execute(q.PAUSE_LEASES, params)


def _log_failed_rollback(done: Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        logger.error(
            "SqliteStore could not roll back a transaction that did not commit",
            exc_info=done.exception(),
        )
