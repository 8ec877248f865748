"""MariaDB / MySQL store: the ledger's guarantees for teams whose database is MySQL.

Every durable ledger step is one SQL statement where the engine has one
(begin's insert-or-read, commit's fenced compare-and-set), in autocommit on
a pooled connection, or a short transaction where MySQL needs two statements
(an update and the read of the row it changed: there is no
``UPDATE ... RETURNING``). ``_mysql_queries`` has every statement and says
why each is written as it is. Timestamps and staleness use the database's
clock, ``UTC_TIMESTAMP(6)``.

MySQL has no ``LISTEN/NOTIFY``. Waiters in this process are woken at once by
the store itself when one of its steps changes an effect (after the
transaction commits, for steps made with ``tx=``); waiters in other
processes find out by polling, with the ledger's shared backoff.

MariaDB and MySQL 8 differ in a few places (``INSERT ... RETURNING``, a
statement-scoped lock wait, the byte-wise collation's name); the store asks
the server which it is once, at connect time, and picks its statements
then. MariaDB 10.11 is what the tests run against.

Needs ``pip install "agent-ledger[mysql]"`` (the asyncmy driver) and MariaDB
10.6 or later, or MySQL 8.0.16 or later.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from importlib import resources
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncmy
from asyncmy.constants import CLIENT

from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import (
    EffectInFlightError,
    EffectLedgerError,
    EffectLedgerValidationError,
    EffectStoreError,
)
from agent_ledger.ids import is_effect_id, new_effect_id
from agent_ledger.options import DEFAULT_TX_LOCK_TIMEOUT_MS
from agent_ledger.status import EffectStatus
from agent_ledger.stores import _mysql_queries as q
from agent_ledger.stores._columns import ROW_COLUMNS
from agent_ledger.stores._dedup import (
    DEFAULT_FLUSH_INTERVAL_S,
    CountsLost,
    PendingCounts,
    check_flush_interval,
    plus_one,
    row_id,
)
from agent_ledger.stores._legacy import LegacyStoreMethods, all_effects
from agent_ledger.stores._mysql_approvals import MySQLApprovals
from agent_ledger.stores._mysql_budgets import MySQLBudgets
from agent_ledger.stores._mysql_sagas import MySQLSagas
from agent_ledger.stores._mysql_tables import (
    DUPLICATE_KEY,
    Cursor,
    error_number,
    stored,
    utc,
)
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
from agent_ledger.stores._subscriptions import Registration, Subscribers
from agent_ledger.stores.base import (
    REPEATABLE_STEPS,
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

__all__ = ["MYSQL_SCHEMA_SQL", "MYSQL_SCHEMA_VERSION", "MySQLStore", "MySQLTransaction"]

#: The schema this version of the library needs: the newest version its schema
#: files record in ``agent_ledger_schema_version`` (a test holds the two equal).
#: The same number as the other stores' schema: the MySQL tables start out as
#: version 3 of the ledger's tables (there never was a MySQL version 1 or 2).
MYSQL_SCHEMA_VERSION: Final = 4
#: The version ``mysql_schema.sql`` creates.
_FIRST_VERSION: Final = 3
#: The text of ``mysql_schema.sql`` (version 3), with ``{collation}`` to fill in.
MYSQL_SCHEMA_SQL: Final = (
    resources.files("agent_ledger.stores").joinpath("mysql_schema.sql").read_text("utf-8")
)
#: The versions after 3, each applied once on top of the one before (none yet).
MYSQL_MIGRATIONS: Final[Mapping[int, str]] = {
    version: resources.files("agent_ledger.stores")
    .joinpath(f"mysql_schema_{version}.sql")
    .read_text("utf-8")
    for version in range(_FIRST_VERSION + 1, MYSQL_SCHEMA_VERSION + 1)
}

#: The asyncmy connection a caller's transaction runs on (``tx=``).
MySQLTransaction = asyncmy.Connection

_T = TypeVar("_T")
#: A statement's parameters: by name (the text protocol), or in order (a
#: ``q.Positional``'s, run as a prepared statement).
_Params = Mapping[str, object] | tuple[object, ...]
#: How many prepared statements each connection keeps (the ``*_PS`` in
#: ``_mysql_queries``, begin's lock bounds included, fit with room to spare).
_STATEMENT_CACHE: Final = 32
_PROCESSING: Final = EffectStatus.PROCESSING.value
#: A duplicate of an effect in one of these is only read by begin, and counted later.
_FINISHED: Final = q.FINISHED
_FINISHED_VALUES: Final = frozenset(_FINISHED)
_STATUS_AT: Final = ROW_COLUMNS.index("status")
_ID_AT: Final = ROW_COLUMNS.index("id")
_KEY_AT: Final = ROW_COLUMNS.index("idem_key")
#: How many keys a store remembers having begun (see ``MySQLStore.begin``).
_KNOWN_KEYS: Final = 10_000
#: How long schema migrations wait for one another (seconds).
_SCHEMA_LOCK_TIMEOUT_S: Final = 60

# MySQL error numbers the store tells apart.
_LOCK_WAIT_TIMEOUT: Final = 1205
_DEADLOCK: Final = 1213
_NO_SUCH_TABLE: Final = 1146
_UNKNOWN_DATABASE: Final = 1049
#: The server refused a value as longer than it holds: data too long for its
#: column (1406), a packet over max_allowed_packet (1153), a string function's
#: result over it (1301), a row too large (1118). The same statement fails again.
_TOO_LONG: Final = frozenset({1406, 1153, 1301, 1118})
#: What a commit statement carries besides the result and usage (two copies of a
#: capped error message, the code, the ids): kept out of ``max_result_bytes``.
_STATEMENT_ROOM: Final = 256 * 1024
#: The connection is gone: the client lost it (2006, 2013, 2055), the server
#: killed it (1927 on MariaDB, 1053 during shutdown, 4031 MySQL's idle timeout).
_LOST: Final = frozenset({2006, 2013, 2055, 1927, 1053, 4031})
#: How often, and how far apart, close()'s flush asks again for rows another
#: transaction held locked (about a second in all).
_CLOSING_RETRIES: Final = 50
_CLOSING_PAUSE_S: Final = 0.02
#: What the driver raises (asyncmy's errors, and the socket's own).
_DRIVER_ERRORS: Final = (asyncmy.errors.MySQLError, OSError, asyncio.IncompleteReadError)
#: A deadlock changes nothing (InnoDB rolled the statement back): try again at once.
_DEADLOCK_TRIES: Final = 4


def _effect_from_row(row: tuple[Any, ...]) -> Effect:
    return effect_from_row(row, utc)


def _status_tuple(statuses: Iterable[EffectStatus]) -> tuple[str, ...]:
    # A tuple, which the driver writes as ('a', 'b') for IN.
    return tuple(sorted(s.value for s in statuses))


def _error_columns(error: EffectError | None) -> dict[str, object]:
    # has_error: a transition keeps the stored error unless given a new one.
    return {
        "has_error": error is not None,
        "error_message": error.message if error is not None else None,
        "error_code": error.code if error is not None else None,
    }


_DIALECT: Final = Dialect(statuses=_status_tuple, error=_error_columns, moment=stored)


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (killed, server restarted, network)."""
    if isinstance(
        exc, asyncmy.errors.InterfaceError | ConnectionError | asyncio.IncompleteReadError
    ):
        return True
    return isinstance(exc, asyncmy.errors.OperationalError) and error_number(exc) in _LOST


def _server_refused(exc: BaseException) -> bool:
    """A statement the server refused (its connection is fine and usable)."""
    number = error_number(exc)
    return isinstance(exc, asyncmy.errors.MySQLError) and number is not None and number < 2000


@dataclasses.dataclass(frozen=True, slots=True)
class _Server:
    """What the store learnt about its server at connect time."""

    mariadb: bool
    version: str
    #: The server's ``max_allowed_packet`` (bytes) at connect time.
    max_allowed_packet: int = 16 * 1024 * 1024

    @property
    def collation(self) -> str:
        return "utf8mb4_nopad_bin" if self.mariadb else "utf8mb4_0900_bin"


class _Pool:
    """The store's connections: reused while healthy, closed at the first doubt.

    A connection goes back to the idle list only after a step ended cleanly
    or with an error the server reported (it is then still in a known state,
    outside any transaction). One interrupted mid-statement (a cancellation,
    a timeout, a lost reply) is closed instead, and the server rolls back
    whatever transaction it had open: a half-done step never leaks to the
    next user of the connection.
    """

    def __init__(self, settings: Mapping[str, Any], max_size: int) -> None:
        self._settings = dict(settings)
        self._slots = asyncio.Semaphore(max_size)
        self._idle: list[Any] = []
        self.closed = False

    async def open(self) -> Any:
        """A new connection in the store's session settings (autocommit, READ COMMITTED)."""
        conn = await asyncmy.connect(**self._settings)
        try:
            async with conn.cursor() as cur:
                await cur.execute(q.SESSION_SQL_MODE, {"mode": q.SQL_MODE})
                await cur.execute(q.SESSION_ISOLATION, {})
        except BaseException:
            conn.close()
            raise
        return conn

    def connection(self) -> _Lease:
        """``async with pool.connection() as conn:`` one connection, given back after."""
        return _Lease(self)

    def _keep(self, conn: Any) -> None:
        if self.closed:
            conn.close()
        else:
            self._idle.append(conn)

    def discard_idle(self) -> None:
        """Close every idle connection (after one was found dead: the rest likely are too)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.ensure_closed()


class _Lease:
    """One use of a pooled connection (``_Pool.connection``). A plain class, not a
    generator-based context manager: it is entered on every step of every call."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._conn: Any = None

    async def __aenter__(self) -> Any:
        pool = self._pool
        if pool.closed:
            raise EffectStoreError("the store is closed", operation="use")
        await pool._slots.acquire()
        try:
            self._conn = pool._idle.pop() if pool._idle else await pool.open()
        except BaseException:
            pool._slots.release()
            raise
        return self._conn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        conn, pool = self._conn, self._pool
        try:
            clean = exc is None or _server_refused(exc)
            if clean and conn.connected and not conn.get_transaction_status():
                pool._keep(conn)
            else:
                conn.close()
        finally:
            pool._slots.release()


class _Subscribers(Subscribers):
    def any(self) -> bool:
        """Whether anyone in this process waits on any key (else a wake needs no key)."""
        return bool(self._by_key)


def _settings_from_url(url: str, connect_timeout: float) -> dict[str, Any]:
    """asyncmy's connect() arguments from ``mysql://user:password@host:port/database``."""
    try:
        parts = urlsplit(url)
        port = parts.port or 3306
    except ValueError as exc:
        raise EffectLedgerValidationError(
            f"malformed MySQL URL {url!r} ({exc}); expected mysql://user:password@host:3306/db",
            field="url",
        ) from None
    if parts.scheme.lower() not in ("mysql", "mariadb"):
        raise EffectLedgerValidationError(
            f"not a MySQL URL: {url!r}; expected mysql:// or mariadb://", field="url"
        )
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise EffectLedgerValidationError(
            f"MySQL URL {url!r} names no database; expected mysql://user@host:3306/db",
            field="url",
        )
    settings: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "user": unquote(parts.username) if parts.username else "root",
        "password": unquote(parts.password) if parts.password else "",
        "database": database,
    }
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "unix_socket":
            settings["unix_socket"] = value
        elif key == "charset" and value == "utf8mb4":
            pass
        else:
            raise EffectLedgerValidationError(
                f"unknown MySQL URL parameter {key!r} in {url!r}; only unix_socket is read",
                field="url",
            )
    return _session(settings, connect_timeout)


def _session(settings: Mapping[str, Any], connect_timeout: float) -> dict[str, Any]:
    """The settings every connection of the store gets, on top of where to connect."""
    return {
        **settings,
        "charset": "utf8mb4",
        "autocommit": True,
        # Affected rows = rows matched, so an UPDATE that sets a value it
        # already had still says it applied.
        "client_flag": CLIENT.FOUND_ROWS,
        "connect_timeout": max(1, math.ceil(connect_timeout)),
        # Statements given their values in order run as server-side prepared
        # statements (the binary protocol; see _mysql_queries).
        "stmt_cache_size": _STATEMENT_CACHE,
    }


class MySQLStore(LegacyStoreMethods, MySQLSagas, MySQLBudgets, MySQLApprovals):
    """Effects in MariaDB or MySQL, shared by every worker that uses the same database.

    Open it with :meth:`connect` (a URL) and close it with :meth:`close`. The
    tables live in the URL's database; ``await store.create_schema()`` (or
    ``agent-ledger init --url mysql://...``) creates them.

    Duplicates are counted in memory and written every
    ``dedup_flush_interval_s`` seconds in one transaction for all keys, on
    :meth:`flush_counts` and on :meth:`close`, so that a replay is one read
    (``stores/_dedup.py`` says what a reader sees and what a crash may lose).
    """

    #: How settle's parameters are spelled here (for the approval steps' ``decide``).
    _dialect = _DIALECT

    @staticmethod
    def _effect_of_row(row: tuple[Any, ...]) -> Effect:
        return _effect_from_row(row)

    def __init__(
        self,
        pool: _Pool,
        beats: _Pool,
        server: _Server,
        *,
        database: str,
        dedup_flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> None:
        interval_s = check_flush_interval(dedup_flush_interval_s)
        self._pool = pool
        self._beats = beats
        self.server = server
        self.database = database
        #: The biggest result (with its usage, in bytes of UTF-8) a commit can
        #: carry: the server's ``max_allowed_packet`` less room for the rest of
        #: the statement. The engine records a bigger one as ``result_too_large``.
        self.max_result_bytes = max(server.max_allowed_packet - _STATEMENT_ROOM, 0)
        self._insert_only = q.INSERT_ONLY_MARIADB if server.mariadb else q.INSERT_ONLY_MYSQL
        self._counts = PendingCounts(
            self._write_counts, interval_s=interval_s, store=f"MySQLStore({database})"
        )
        #: Keys this store has begun, oldest first: a begin of one of them
        #: tries a plain read first (a replay, most likely).
        self._known: dict[str, None] = {}
        #: The key of each effect this store begun or claimed, by id, to wake
        #: this process's waiters on a commit (which names the effect by id).
        self._key_of: dict[str, str] = {}
        self._subscribers = _Subscribers()
        #: Keys changed inside each open ``transaction()``, by connection: woken at commit.
        self._tx_changes: dict[int, set[str]] = {}
        #: Set by close(): its flush of the duplicate counts is the last one.
        self._closing = False

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        max_size: int = 10,
        connect_timeout: float = 30.0,
        dedup_flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> MySQLStore:
        """Connect to ``mysql://user:password@host:port/database`` (``mariadb://`` too).

        Makes one connection at once, so a wrong URL, a refused login or an
        unknown database fails here with the server's own message
        (``EffectStoreError``), and learns whether the server is MariaDB or
        MySQL. At most ``max_size`` connections are open for steps, plus one
        for heartbeats.
        """
        check_flush_interval(dedup_flush_interval_s)
        if type(max_size) is not int or max_size < 1:
            raise EffectLedgerValidationError(
                f"max_size must be an int of at least 1, got {max_size!r}", field="max_size"
            )
        settings = _settings_from_url(url, connect_timeout)
        pool = _Pool(settings, max_size)
        try:
            async with asyncio.timeout(connect_timeout):
                conn = await pool.open()
        except TimeoutError:
            raise EffectStoreError(
                f"no answer from MySQL within {connect_timeout:g} s", operation="connect"
            ) from None
        except (asyncmy.errors.MySQLError, OSError) as exc:
            reason = " ".join(str(exc).split())
            raise EffectStoreError(
                f"cannot connect to MySQL: {reason}", operation="connect"
            ) from exc
        try:
            async with conn.cursor() as cur:
                await cur.execute(q.SERVER_VERSION)
                version, packet = await cur.fetchone()
        except BaseException:
            conn.close()
            raise
        pool._keep(conn)
        server = _Server(
            mariadb="mariadb" in str(version).lower(),
            version=str(version),
            max_allowed_packet=int(packet),
        )
        return cls(
            pool,
            _Pool(settings, 1),
            server,
            database=settings["database"],
            dedup_flush_interval_s=dedup_flush_interval_s,
        )

    # -- schema ----------------------------------------------------------------

    async def create_schema(self) -> None:
        """Create the tables in the connection's database, or upgrade them; idempotent.

        ``migrate()`` does the same and says what it did.
        """
        await self._migrate("create_schema")

    async def migrate(self) -> SchemaMigration:
        """Create or upgrade the tables (see ``Store.migrate``); what version it found and left.

        MySQL commits DDL as it goes, so a migration cannot be one
        transaction: every statement of a version may run again, and the
        version is recorded last. Concurrent migrations take turns on a
        named lock (``GET_LOCK``), so each reports what it really found.
        """
        return await self._migrate("migrate")

    async def _migrate(self, operation: str) -> SchemaMigration:
        with self._errors(operation):
            async with self._pool.connection() as conn, conn.cursor() as cur:
                await cur.execute(q.SCHEMA_LOCK, {"timeout_s": _SCHEMA_LOCK_TIMEOUT_S})
                (locked,) = await cur.fetchone()
                if locked != 1:
                    raise EffectStoreError(
                        f"another process held the schema lock for {_SCHEMA_LOCK_TIMEOUT_S} s; "
                        "try again once its migration is done",
                        operation=operation,
                    )
                try:
                    found = await self._version_in(cur)
                    self._refuse_newer(found)
                    if found < _FIRST_VERSION:
                        for statement in _statements(MYSQL_SCHEMA_SQL, self.server.collation):
                            await cur.execute(statement)
                    for version, script in MYSQL_MIGRATIONS.items():
                        if await self._version_in(cur) < version:
                            for statement in _statements(script, self.server.collation):
                                await cur.execute(statement)
                    left = await self._version_in(cur)
                finally:
                    await cur.execute(q.SCHEMA_UNLOCK, {})
        return SchemaMigration(found, left)

    def _refuse_newer(self, found: int) -> None:
        """A schema newer than this library was migrated by a newer release: refuse it."""
        if found > MYSQL_SCHEMA_VERSION:
            raise EffectStoreError(
                f"database {self.database!r} is at agent-ledger MySQL schema version {found}, "
                f"newer than this library's {MYSQL_SCHEMA_VERSION}: a newer release migrated "
                "it. Upgrade agent-ledger to use it; this version would misread its rows.",
                operation="check_schema",
            )

    @staticmethod
    async def _version_in(cur: Cursor) -> int:
        """The schema version the connection's database holds; 0 when it has no tables yet."""
        await cur.execute(q.HAS_VERSIONS_TABLE, {})
        (present,) = await cur.fetchone()
        if not present:
            return 0
        await cur.execute(q.SCHEMA_VERSION, {})
        row = await cur.fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    async def check_schema(self) -> int:
        """The schema version in the database; raises with a fix if it is missing or old."""

        async def work(cur: Cursor) -> int:
            return await self._version_in(cur)

        version = await self._run("check_schema", work, None, atomic=False)
        self._refuse_newer(version)
        if version < MYSQL_SCHEMA_VERSION:
            fix = (
                "run `agent-ledger init --url mysql://...` (or await store.create_schema())"
                if version == 0
                else "run `agent-ledger migrate` (or await store.migrate())"
            )
            raise EffectStoreError(
                f"database {self.database!r} is at agent-ledger MySQL schema version "
                f"{version or None}, this library needs {MYSQL_SCHEMA_VERSION}: {fix}",
                operation="check_schema",
            )
        return version

    # -- ledger steps -----------------------------------------------------------

    async def begin(
        self, new: NewEffect, *, tx: object | None = None, lock_timeout_ms: int | None = None
    ) -> BeginOutcome:
        key = new.idem_key
        if tx is not None:
            params = begin_params(new)
            params["id"] = new_effect_id()
            return await self._begin_inside(tx, params, key, lock_timeout_ms)
        counts = self._counts
        known = self._known
        if key in known:
            # Seen here before: most likely a replay, and a plain read is the
            # cheapest answer (no row lock, no write). Anything but a finished
            # effect goes on to the insert-or-read as usual.
            started = counts.epoch
            row = await self._fetch_one("begin", q.FIND_PS.sql, (key,), None, idem_key=key)
            if row is not None and row[_STATUS_AT] in _FINISHED_VALUES:
                # Counted once the answer is certain: a replay that raises counts nothing.
                (row,) = await self._counted([row], started, None)
                counts.add(row_id(row))
                return BeginOutcome(_effect_from_row(plus_one(row)), created=False)
        elif len(known) >= _KNOWN_KEYS:
            del known[next(iter(known))]
        known[key] = None
        # The id this store gives the effect if the key is new: the row's id
        # tells an insert from a key that existed (see BEGIN_* in _mysql_queries).
        params = begin_params(new)
        params["id"] = new_effect_id()
        started = counts.epoch
        mariadb = self.server.mariadb
        statement = q.begin_ps(mariadb, self._lock_wait_s(lock_timeout_ms))
        args = statement.args(params)
        if mariadb:
            row = await self._lock_bounded(
                self._fetch_one("begin", statement.sql, args, None, idem_key=key),
                key,
                lock_timeout_ms,
            )
        else:

            async def insert_then_read(cur: Cursor) -> tuple[Any, ...] | None:
                await cur.execute(statement.sql, args)
                await cur.execute(q.FIND_PS.sql, (key,))
                found: tuple[Any, ...] | None = await cur.fetchone()
                return found

            row = await self._run("begin", insert_then_read, None, atomic=True, idem_key=key)
        if row is None:
            raise EffectStoreError(
                "the effect this key conflicted with was not found (purged meanwhile?); call again",
                operation="begin",
                idem_key=key,
            )
        self._remember(row)
        if row[_ID_AT] == params["id"]:
            return BeginOutcome(_effect_from_row(row), created=True)
        if row[_STATUS_AT] not in _FINISHED_VALUES:
            # Open: the statement counted this duplicate already.
            (row,) = await self._counted([row], started, None)
            return BeginOutcome(_effect_from_row(row), created=False)
        # Finished: counted later, and only once the answer is certain.
        (row,) = await self._counted([row], started, None)
        counts.add(row_id(row))
        return BeginOutcome(_effect_from_row(plus_one(row)), created=False)

    async def _begin_inside(
        self, tx: object, params: dict[str, object], key: str, lock_timeout_ms: int | None
    ) -> BeginOutcome:
        """``begin`` inside a caller's transaction: read, or insert (see
        ``INSERT_ONLY_*``), waiting for no lock longer than the bound."""
        conn = self._tx_connection(tx, bounded=True)
        insert_only = self._insert_only
        mariadb = self.server.mariadb
        started = self._counts.epoch

        async def work(cur: Cursor) -> tuple[tuple[Any, ...] | None, bool]:
            await cur.execute(q.FIND, params)
            found: tuple[Any, ...] | None = await cur.fetchone()
            if found is not None:
                return found, False
            try:
                await self._bounded(cur, insert_only, params, lock_timeout_ms, key)
            except asyncmy.errors.IntegrityError as exc:
                if error_number(exc) != DUPLICATE_KEY:
                    raise
                # Inserted by a transaction that committed after this one's
                # snapshot: the locking read sees it.
                await cur.execute(q.FIND_LOCKED, params)
                return await cur.fetchone(), False
            if mariadb:
                return await cur.fetchone(), True
            await cur.execute(q.FIND, params)
            return await cur.fetchone(), True

        row, created = await self._run("begin", work, conn, atomic=False, idem_key=key)
        if row is None:
            raise EffectStoreError(
                "the effect this key conflicted with is gone (purged meanwhile?); call again",
                operation="begin",
                idem_key=key,
            )
        self._remember(row)
        if created:
            return BeginOutcome(_effect_from_row(row), created=True)
        (row,) = await self._counted([row], started, conn)
        return BeginOutcome(_effect_from_row(row), created=False)

    async def claim(
        self,
        idem_key: str,
        *,
        stale_after_ms: int,
        lease_ms: int | None = None,
        tx: object | None = None,
        lock_timeout_ms: int | None = None,
    ) -> ClaimOutcome:
        params = claim_params(_DIALECT, idem_key, stale_after_ms=stale_after_ms, lease_ms=lease_ms)
        started = self._counts.epoch
        conn = None if tx is None else self._tx_connection(tx, bounded=True)

        bound = self._lock_bound(lock_timeout_ms)

        async def work(cur: Cursor) -> tuple[tuple[Any, ...] | None, bool]:
            if conn is None:
                claimed = await cur.execute(bound + q.CLAIM, params) == 1
            else:
                claimed = await self._bounded(cur, q.CLAIM, params, lock_timeout_ms, idem_key) == 1
            await cur.execute(q.FIND_PS.sql, (idem_key,))
            row: tuple[Any, ...] | None = await cur.fetchone()
            return row, claimed

        row, claimed = await self._lock_bounded(
            self._run("claim", work, conn, atomic=True, idem_key=idem_key),
            idem_key,
            lock_timeout_ms if conn is None else None,
        )
        if row is None:
            return ClaimOutcome(None, claimed=False)
        if claimed:
            self._remember(row)
            self._changed(idem_key, conn)
        (row,) = await self._counted([row], started, conn)
        return ClaimOutcome(_effect_from_row(row), claimed=claimed)

    async def retry_failed(self, idem_key: str, *, attempt: int, lease_ms: int) -> ClaimOutcome:
        params = retry_failed_params(_DIALECT, idem_key, attempt=attempt, lease_ms=lease_ms)
        return await self._claim_by_key(
            "retry_failed", q.RETRY_FAILED, params, idem_key, will_commit=True
        )

    async def heartbeat(self, held: Sequence[Held]) -> HeartbeatOutcome:
        batch = {one for one in held if is_effect_id(one.effect_id)}
        if not batch:
            return HeartbeatOutcome(frozenset())
        ids = tuple(sorted({one.effect_id for one in batch}))

        async def beat(cur: Cursor) -> HeartbeatOutcome:
            await cur.execute(q.HEARTBEAT_FREE, {"ids": ids, "processing": _PROCESSING})
            free = {Held(str(id_), int(attempt)) for id_, attempt in await cur.fetchall()}
            refreshed = free & batch
            if refreshed:
                beat_ids = tuple(sorted(one.effect_id for one in refreshed))
                await cur.execute(q.HEARTBEAT_BEAT, {"ids": beat_ids})
            missing = tuple(sorted({one.effect_id for one in batch - refreshed}))
            busy: set[Held] = set()
            if missing:
                # Locked by another transaction (busy) or no longer held: tell them apart.
                await cur.execute(q.HEARTBEAT_HELD, {"ids": missing, "processing": _PROCESSING})
                still = {Held(str(i), int(a)) for i, a in await cur.fetchall()}
                busy = (still & batch) - refreshed
            return HeartbeatOutcome(frozenset(refreshed), frozenset(busy))

        effect_id = ids[0] if len(ids) == 1 else None
        return await self._run(
            "heartbeat", beat, None, atomic=True, effect_id=effect_id, pool=self._beats
        )

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
        # An id this store read from one of its rows is one (no need to parse it).
        if effect_id not in self._key_of and not is_effect_id(effect_id):
            return False
        conn = None if tx is None else self._tx_connection(tx)
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
        args = q.COMMIT_PS.args(params)
        if not await self._execute("commit", q.COMMIT_PS.sql, args, conn, effect_id=effect_id):
            return False
        await self._changed_by_id(effect_id, conn)
        return True

    async def record_try(
        self, effect_id: str, *, attempt: int, error: EffectError, error_type: str
    ) -> bool:
        if not is_effect_id(effect_id):
            return False
        params = record_try_params(effect_id, attempt=attempt, error=error, error_type=error_type)
        args = q.RECORD_TRY_PS.args(params)
        return await self._execute(
            "record_try", q.RECORD_TRY_PS.sql, args, None, effect_id=effect_id
        )

    async def release(self, effect_id: str, *, attempt: int, for_approval: bool = False) -> bool:
        if not is_effect_id(effect_id):
            return False
        params = release_params(effect_id, attempt=attempt, for_approval=for_approval)
        args = q.RELEASE_PS.args(params)
        if not await self._execute("release", q.RELEASE_PS.sql, args, None, effect_id=effect_id):
            return False
        await self._changed_by_id(effect_id, None)
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
        params = transition_params(
            _DIALECT,
            idem_key,
            target=target,
            error=error,
            decision=decision,
            sources=transition_sources(target, sources),
        )
        conn = None if tx is None else self._tx_connection(tx)
        return await self._update_then_read("transition", q.TRANSITION, params, conn, idem_key)

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> Effect | None:
        params = reopen_params(_DIALECT, idem_key, by=by, reason=reason)
        return await self._update_then_read("reopen", q.REOPEN, params, None, idem_key)

    async def mark_started(
        self, effect_id: str, *, attempt: int, worker: str, tx: object | None = None
    ) -> bool:
        if not is_effect_id(effect_id):
            return False
        conn = None if tx is None else self._tx_connection(tx)
        params = mark_started_params(effect_id, attempt=attempt, worker=worker)
        args = q.MARK_STARTED_PS.args(params)
        return await self._execute(
            "mark_started", q.MARK_STARTED_PS.sql, args, conn, effect_id=effect_id
        )

    async def park(self, idem_key: str, *, stale_after_ms: int, error: EffectError) -> ClaimOutcome:
        params = park_params(_DIALECT, idem_key, stale_after_ms=stale_after_ms, error=error)
        return await self._claim_by_key("park", q.PARK, params, idem_key, will_commit=False)

    async def _claim_by_key(
        self,
        operation: str,
        statement: str,
        params: dict[str, object],
        idem_key: str,
        *,
        will_commit: bool,
    ) -> ClaimOutcome:
        """A compare-and-set by key (``retry_failed``'s claim, ``park``) and the row it
        left, in one transaction; ``claimed``: this call moved it. ``will_commit``:
        a moved row is one this process commits later (``_remember`` its key)."""
        started = self._counts.epoch

        async def work(cur: Cursor) -> tuple[tuple[Any, ...] | None, bool]:
            moved = await cur.execute(statement, params) == 1
            await cur.execute(q.FIND_PS.sql, (idem_key,))
            row: tuple[Any, ...] | None = await cur.fetchone()
            return row, moved

        row, moved = await self._run(operation, work, None, atomic=True, idem_key=idem_key)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        if moved:
            if will_commit:
                self._remember(row)
            self._changed(idem_key, None)
        (row,) = await self._counted([row], started, None)
        return ClaimOutcome(_effect_from_row(row), claimed=moved)

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
        return await self._update_then_read("settle", q.SETTLE, params, None, idem_key)

    async def _update_then_read(
        self,
        operation: str,
        statement: str,
        params: dict[str, object],
        conn: Any,
        idem_key: str,
    ) -> Effect | None:
        """A compare-and-set by key and the row it left, in one transaction (or the caller's)."""
        started = self._counts.epoch

        async def work(cur: Cursor) -> tuple[Any, ...] | None:
            if await cur.execute(statement, params) != 1:
                return None
            await cur.execute(q.FIND_PS.sql, (idem_key,))
            row: tuple[Any, ...] | None = await cur.fetchone()
            return row

        row = await self._run(operation, work, conn, atomic=True, idem_key=idem_key)
        if row is None:
            return None
        self._changed(idem_key, conn)
        (row,) = await self._counted([row], started, conn)
        return _effect_from_row(row)

    async def get(self, effect_id: str, *, tx: object | None = None) -> Effect | None:
        if not is_effect_id(effect_id):
            return None
        conn = None if tx is None else self._tx_connection(tx)
        started = self._counts.epoch
        row = await self._fetch_one("get", q.GET_PS.sql, (effect_id,), conn, effect_id=effect_id)
        return None if row is None else await self._one_counted(row, started, conn)

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        conn = None if tx is None else self._tx_connection(tx)
        started = self._counts.epoch
        row = await self._fetch_one("find", q.FIND_PS.sql, (idem_key,), conn, idem_key=idem_key)
        return None if row is None else await self._one_counted(row, started, conn)

    async def find_legacy(self, legacy_key: str, *, tx: object | None = None) -> Effect | None:
        conn = None if tx is None else self._tx_connection(tx)
        started = self._counts.epoch
        row = await self._fetch_one("find_legacy", q.FIND_LEGACY, {"legacy_key": legacy_key}, conn)
        return None if row is None else await self._one_counted(row, started, conn)

    async def record_legacy(self, legacy_key: str, idem_key: str) -> bool:
        """Record that 0.2.x's ``legacy_key`` names the effect keyed ``idem_key``
        here, as ``agent-ledger import-0.2`` does for each row it brings over.

        True if recorded; False, changing nothing, if ``legacy_key`` already
        has a mapping (the first one stays).
        """
        params = {"legacy_key": legacy_key, "idem_key": idem_key}

        async def work(cur: Cursor) -> bool:
            try:
                await cur.execute(q.RECORD_LEGACY, params)
            except asyncmy.errors.IntegrityError as exc:
                if error_number(exc) == DUPLICATE_KEY:
                    return False
                raise
            return True

        return await self._run("record_legacy", work, None, atomic=False)

    # -- audit --------------------------------------------------------------------

    async def list_effects(self, query: EffectQuery | None = None) -> list[Effect]:
        if query is None:
            return await all_effects(self)  # 0.2.x's bare call
        if query.before is not None and not is_effect_id(query.before[1]):
            raise EffectLedgerValidationError("cursor names no effect", field="cursor")
        names, params = list_params(_DIALECT, query)
        filters = [q.LIST_FILTERS[name] for name in names]
        # Only fixed fragments are joined; every value is a parameter.
        statement = q.LIST + (" WHERE " + " AND ".join(filters) if filters else "") + q.LIST_ORDER
        started = self._counts.epoch

        async def work(cur: Cursor) -> list[tuple[Any, ...]]:
            await cur.execute(statement, params)
            return list(await cur.fetchall())

        rows = await self._run("list_effects", work, None, atomic=False)
        return [_effect_from_row(row) for row in await self._counted(rows, started, None)]

    async def stats(self) -> LedgerStats:
        """Counts over the table; its ``duplicates`` include this process's counts.

        It first writes the pending duplicate counts (so other processes see
        them too). Those the write left pending (a row another transaction
        holds locked is skipped, not waited for; or the write failed) are
        added to the totals, as every read adds them to the rows it returns:
        those of effects still stored, read after the totals (an effect
        purged in between is left out: low, never high).
        """
        with contextlib.suppress(EffectStoreError):
            await self.flush_counts()
        counts = self._counts
        async with counts.quiet():
            unwritten = counts.snapshot()

            async def work(cur: Cursor) -> tuple[list[Any], list[Any]]:
                await cur.execute(q.STATS, {})
                totals = list(await cur.fetchall())
                stored_counts: list[Any] = []
                if unwritten:
                    await cur.execute(q.DEDUP_COUNTS, {"ids": tuple(unwritten)})
                    stored_counts = list(await cur.fetchall())
                return totals, stored_counts

            rows, stored_rows = await self._run("stats", work, None, atomic=False)
        totals = stats_from_groups(
            (STATUS_BY_VALUE[st], tool, int(n), int(d)) for st, tool, n, d in rows
        )
        extra = sum(unwritten[str(effect_id)] for effect_id, _ in stored_rows)
        return dataclasses.replace(totals, duplicates=totals.duplicates + extra)

    async def purge(self, *, older_than: timedelta, statuses: frozenset[EffectStatus]) -> int:
        check_purge_statuses(statuses)
        params = {
            "statuses": _status_tuple(statuses),
            "older_us": older_than // timedelta(microseconds=1),
        }

        async def work(cur: Cursor) -> int:
            return int(await cur.execute(q.PURGE, params))

        return await self._run("purge", work, None, atomic=False)

    # -- transactions and notifications -------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """A pooled connection inside ``START TRANSACTION ... COMMIT``, to pass as ``tx``.

        Failing to open or commit the transaction raises ``EffectStoreError``;
        an error raised inside the block (your own SQL included) propagates
        unchanged after the rollback. Waiters in this process on the keys the
        block changed are woken once it commits.

        Your own asyncmy ``Connection`` with an open transaction works as
        ``tx`` too (then your code decides when it commits, and this
        process's waiters are woken at once, polling again until they see it).
        """
        body_failed = False
        changes: set[str] = set()
        try:
            async with self._pool.connection() as conn:
                await conn.begin()
                self._tx_changes[id(conn)] = changes
                # The caller's own statements go by the text protocol, as on
                # any asyncmy connection (a prepared statement reads some
                # types differently, FLOAT for one); so do the store's steps
                # given this tx.
                conn._stmt_cache_size = 0
                try:
                    try:
                        yield conn
                    except BaseException:
                        body_failed = True
                        raise
                    await conn.commit()
                except BaseException:
                    if conn.connected and conn.get_transaction_status():
                        # Interrupted or failed: the pool closes the
                        # connection, and the server rolls back on its own,
                        # unless a rollback here ends it cleanly first.
                        with contextlib.suppress(Exception):
                            await conn.rollback()
                    raise
                finally:
                    self._tx_changes.pop(id(conn), None)
                    conn._stmt_cache_size = _STATEMENT_CACHE
        except asyncmy.errors.MySQLError as exc:
            if body_failed:
                raise  # the caller's own statement failed: theirs to see unchanged
            raise EffectStoreError(
                f"{type(exc).__name__}: {exc}".strip(), operation="transaction"
            ) from exc
        except OSError as exc:
            if body_failed:
                raise
            raise EffectStoreError(f"{type(exc).__name__}: {exc}", operation="transaction") from exc
        for key in changes:
            self._subscribers.wake(key)

    def subscribe(self, idem_key: str) -> Registration:
        return self._subscribers.subscribe(idem_key)

    async def close(self) -> None:
        """Write the pending duplicate counts, then close every connection.

        A failure to write the counts is logged, not raised, and loses them:
        call :meth:`flush_counts` first to see it.
        """
        if self._pool.closed:
            return
        self._closing = True
        await self._counts.close()
        await self._beats.close()
        await self._pool.close()

    # -- duplicate counts --------------------------------------------------------

    async def flush_counts(self) -> None:
        """Write every duplicate this store counted so far, in one transaction, now.

        Every other process then sees them (this one always does). Raises
        ``EffectStoreError`` if the write failed; the counts stay pending for
        the next flush, except when the connection was lost while the COMMIT
        was on its way (they are dropped rather than risk counting them
        twice). Rows another transaction holds locked are left for the next
        flush. Cancelling the caller does not cancel the write.
        """
        await self._counts.flush()

    async def _write_counts(self, batch: Mapping[str, int]) -> list[str]:
        """Add ``batch`` (by effect id) to the stored counts; the ids it skipped (locked rows)."""
        ids = tuple(batch)
        by_count: dict[int, list[str]] = {}
        with self._errors("flush_counts"):
            async with self._pool.connection() as conn, conn.cursor() as cur:
                await conn.begin()
                await cur.execute(q.DEDUP_LOCK, {"ids": ids})
                free = {str(row[0]) for row in await cur.fetchall()}
                # The last flush (close) has no next one to leave locked rows
                # to: it asks again for a while (the locks are other steps'
                # short transactions), never waiting on a lock itself.
                for _ in range(_CLOSING_RETRIES if self._closing else 0):
                    busy = tuple(effect_id for effect_id in ids if effect_id not in free)
                    if not busy:
                        break
                    await asyncio.sleep(_CLOSING_PAUSE_S)
                    await cur.execute(q.DEDUP_LOCK, {"ids": busy})
                    free |= {str(row[0]) for row in await cur.fetchall()}
                for effect_id in free:
                    by_count.setdefault(batch[effect_id], []).append(effect_id)
                for n, group in sorted(by_count.items()):
                    await cur.execute(q.DEDUP_ADD, {"n": n, "ids": tuple(sorted(group))})
                skipped = tuple(effect_id for effect_id in ids if effect_id not in free)
                left: list[str] = []
                if skipped:
                    await cur.execute(q.DEDUP_COUNTS, {"ids": skipped})
                    left = [str(row[0]) for row in await cur.fetchall()]
                try:
                    await conn.commit()
                except Exception as exc:
                    if _lost(exc):
                        raise CountsLost("the connection was lost during COMMIT") from exc
                    raise
        return left

    async def _counted(
        self, rows: list[tuple[Any, ...]], started: int, tx: object | None
    ) -> list[tuple[Any, ...]]:
        """``rows`` with this process's unwritten duplicates counted (``PendingCounts.counted``)."""
        return await self._counts.counted(rows, started, self._read_counts, tx)

    async def _read_counts(self, ids: list[str], tx: object | None) -> dict[str, int]:
        """The stored ``dedup_count`` of each of ``ids`` that still exists."""

        async def work(cur: Cursor) -> dict[str, int]:
            await cur.execute(q.DEDUP_COUNTS, {"ids": tuple(ids)})
            return {str(i): int(n) for i, n in await cur.fetchall()}

        return await self._run("get", work, tx, atomic=False)

    async def _one_counted(self, row: tuple[Any, ...], started: int, tx: object | None) -> Effect:
        (row,) = await self._counted([row], started, tx)
        return _effect_from_row(row)

    # -- waking this process's waiters -----------------------------------------------

    def _remember(self, row: tuple[Any, ...]) -> None:
        """Note an effect's key by its id, so a commit by id can wake its waiters."""
        key_of = self._key_of
        if len(key_of) >= _KNOWN_KEYS:
            del key_of[next(iter(key_of))]
        key_of[str(row[_ID_AT])] = str(row[_KEY_AT])

    def _changed(self, idem_key: str, conn: Any) -> None:
        """Wake this process's waiters on ``idem_key`` now, or when ``conn``'s
        transaction (one of this store's) commits."""
        if conn is not None:
            pending = self._tx_changes.get(id(conn))
            if pending is not None:
                pending.add(idem_key)
                return
        self._subscribers.wake(idem_key)

    async def _changed_by_id(self, effect_id: str, conn: Any) -> None:
        if not self._subscribers.any():
            return  # nobody here waits for anything: no need for the key
        key = self._key_of.get(effect_id)
        if key is None:
            row = await self._fetch_one("commit", q.KEY_OF_PS.sql, (effect_id,), conn)
            if row is None:
                return
            key = str(row[0])
        self._changed(key, conn)

    # -- plumbing ---------------------------------------------------------------

    def _tx_connection(self, tx: object, *, bounded: bool = False) -> Any:
        """The caller's connection, checked: an asyncmy ``Connection``, in a transaction
        for the steps that bound their lock waits."""
        if not isinstance(tx, asyncmy.Connection):
            raise EffectLedgerValidationError(
                "tx must be an asyncmy Connection (e.g. from store.transaction())", field="tx"
            )
        if bounded and tx.get_autocommit() and not tx.get_transaction_status():
            raise EffectLedgerValidationError(
                "tx is an autocommit connection with no transaction open; pass "
                "store.transaction()'s connection, or call `await conn.begin()` on your own first",
                field="tx",
            )
        return tx

    def _lock_wait_s(self, lock_timeout_ms: int | None) -> int | None:
        """The whole seconds ``_lock_bound`` bounds a lock wait to (None: not bounded)."""
        if lock_timeout_ms is None or not self.server.mariadb:
            return None
        return lock_timeout_ms // 1000

    def _lock_bound(self, lock_timeout_ms: int | None) -> str:
        """The prefix that bounds a statement's lock wait outside any transaction:
        MariaDB's ``SET STATEMENT`` in whole seconds, rounded down (0: no wait at
        all; the engine waits out the rest of its slice before it tries again).
        MySQL 8 has no per-statement form, and its plain steps keep the
        server's ``innodb_lock_wait_timeout``."""
        if lock_timeout_ms is None or not self.server.mariadb:
            return ""
        return q.LOCK_BOUND_MARIADB.format(seconds=lock_timeout_ms // 1000)

    @staticmethod
    async def _lock_bounded(step: Awaitable[_T], idem_key: str, lock_timeout_ms: int | None) -> _T:
        """``step``, with a lock wait that ran out (error 1205: InnoDB undid the
        statement) as ``EffectInFlightError``, when the step was bounded."""
        try:
            return await step
        except EffectStoreError as exc:
            cause = exc.__cause__
            if (
                lock_timeout_ms is not None
                and isinstance(cause, asyncmy.errors.OperationalError)
                and error_number(cause) == _LOCK_WAIT_TIMEOUT
            ):
                raise EffectInFlightError(idem_key, None, lock_timeout_ms=lock_timeout_ms) from None
            raise

    async def _bounded(
        self,
        cur: Cursor,
        statement: str,
        params: Mapping[str, object],
        lock_timeout_ms: int | None,
        idem_key: str,
    ) -> int:
        """``statement`` inside a caller's transaction, waiting at most ``lock_timeout_ms``
        (rounded up to whole seconds: InnoDB counts no finer) for a row lock
        another transaction holds; past that ``EffectInFlightError``, and the
        statement alone is undone (the caller's transaction stays usable)."""
        ms = DEFAULT_TX_LOCK_TIMEOUT_MS if lock_timeout_ms is None else lock_timeout_ms
        seconds = max(1, math.ceil(ms / 1000))
        try:
            if self.server.mariadb:
                return int(
                    await cur.execute(
                        q.LOCK_BOUND_MARIADB.format(seconds=seconds) + statement, params
                    )
                )
            await cur.execute(q.LOCK_WAIT_READ, {})
            (prior,) = await cur.fetchone()
            await cur.execute(q.LOCK_WAIT_SET.format(seconds=seconds), {})
            try:
                return int(await cur.execute(statement, params))
            finally:
                await cur.execute(q.LOCK_WAIT_SET.format(seconds=int(prior)), {})
        except asyncmy.errors.OperationalError as exc:
            if error_number(exc) == _LOCK_WAIT_TIMEOUT:
                raise EffectInFlightError(idem_key, None, lock_timeout_ms=ms) from None
            raise

    @contextmanager
    def _errors(
        self, operation: str, *, idem_key: str | None = None, effect_id: str | None = None
    ) -> Iterator[None]:
        """Driver errors become ``EffectStoreError`` (``_store_error``), for steps off the
        hot path (``_run`` catches them itself, without a generator)."""
        try:
            yield
        except EffectLedgerError:
            raise  # ours already: never double-wrap
        except _DRIVER_ERRORS as exc:
            raise self._store_error(exc, operation, idem_key, effect_id) from exc

    def _store_error(
        self,
        exc: BaseException,
        operation: str,
        idem_key: str | None,
        effect_id: str | None,
    ) -> EffectStoreError:
        """The one place a driver error becomes ``EffectStoreError``."""
        if error_number(exc) == _NO_SUCH_TABLE:
            message = (
                f"the agent-ledger tables are missing from database {self.database!r}: run "
                "`agent-ledger init --url mysql://...` (or await store.create_schema())"
            )
        else:
            message = f"{type(exc).__name__}: {exc}".strip()
        return EffectStoreError(
            message,
            operation=operation,
            idem_key=idem_key,
            effect_id=effect_id,
            too_long=error_number(exc) in _TOO_LONG,
        )

    async def _fetch_one(
        self,
        operation: str,
        statement: str,
        params: _Params,
        tx: object | None,
        *,
        idem_key: str | None = None,
        effect_id: str | None = None,
    ) -> tuple[Any, ...] | None:
        async def fetch(cur: Cursor) -> tuple[Any, ...] | None:
            await cur.execute(statement, params)
            row: tuple[Any, ...] | None = await cur.fetchone()
            return row

        return await self._run(
            operation, fetch, tx, atomic=False, idem_key=idem_key, effect_id=effect_id
        )

    async def _execute(
        self,
        operation: str,
        statement: str,
        params: _Params,
        tx: object | None,
        *,
        effect_id: str | None = None,
    ) -> bool:
        async def execute(cur: Cursor) -> bool:
            return bool(await cur.execute(statement, params) == 1)

        return await self._run(operation, execute, tx, atomic=False, effect_id=effect_id)

    async def _run(
        self,
        operation: str,
        work: Callable[[Cursor], Awaitable[_T]],
        tx: object | None,
        *,
        atomic: bool,
        idem_key: str | None = None,
        effect_id: str | None = None,
        pool: _Pool | None = None,
    ) -> _T:
        """``work(cursor)`` for step ``operation``: on the caller's transaction ``tx``
        as it is, or on a pooled connection, as one transaction if ``atomic``
        (else in autocommit).

        Outside a caller's transaction, a deadlock (InnoDB undid everything
        the step did) is tried again at once, a few times; a lost connection
        is tried again once, on a fresh connection, if the step is in
        ``REPEATABLE_STEPS`` (``stores.base`` says which and why), after the
        pool drops its idle connections (likely dead the same way).
        """
        try:
            if tx is not None:
                conn = self._tx_connection(tx)
                async with conn.cursor() as cur:
                    return await work(cur)
            pool = pool or self._pool
            repeatable = operation in REPEATABLE_STEPS
            lost_once = False
            for _ in range(_DEADLOCK_TRIES):
                try:
                    async with pool.connection() as conn, conn.cursor() as cur:
                        if not atomic:
                            return await work(cur)
                        await conn.begin()
                        result = await work(cur)
                        await conn.commit()
                        return result
                except asyncmy.errors.OperationalError as exc:
                    if error_number(exc) == _DEADLOCK:
                        continue
                    if not _lost(exc):
                        raise
                    pool.discard_idle()
                    if not repeatable or lost_once:
                        raise
                    lost_once = True
                except (asyncmy.errors.InterfaceError, ConnectionError) as exc:
                    pool.discard_idle()
                    if not repeatable or lost_once:
                        raise EffectStoreError(
                            f"{type(exc).__name__}: {exc}".strip() or "connection lost",
                            operation=operation,
                            idem_key=idem_key,
                            effect_id=effect_id,
                        ) from exc
                    lost_once = True
        except EffectLedgerError:
            raise  # ours already: never double-wrap
        except _DRIVER_ERRORS as exc:
            raise self._store_error(exc, operation, idem_key, effect_id) from exc
        raise EffectStoreError(
            f"deadlocked {_DEADLOCK_TRIES} times in a row; call again",
            operation=operation,
            idem_key=idem_key,
            effect_id=effect_id,
        )


def _statements(script: str, collation: str) -> Iterator[str]:
    """The statements of a schema file, comments dropped, ``{collation}`` filled in.

    Each ends with ``;`` at the end of a line; none of ours has one inside.
    """
    pending: list[str] = []
    for line in script.splitlines():
        text = line.split("--", 1)[0].rstrip() if line.lstrip().startswith("--") else line
        if not text.strip():
            continue
        pending.append(text)
        if text.rstrip().endswith(";"):
            yield "\n".join(pending).rstrip().rstrip(";").replace("{collation}", collation)
            pending = []
    if pending:
        raise ValueError(f"incomplete statement at the end of a schema file: {pending!r}")
