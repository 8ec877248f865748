"""PostgreSQL store: the ledger's guarantees across processes, machines and restarts.

Every ledger step is one SQL statement and one round trip, in autocommit
unless the caller passes a transaction (``_postgres_queries`` has them all).
Timestamps and staleness use the database clock. Waiters are woken by
``LISTEN/NOTIFY`` through one listening connection per store, with the
ledger's polling as the fallback, so a lost notification only costs latency.
Heartbeats go out on one more connection of the store's own, never a pool
connection: a handler that holds the whole pool must not starve them.

Needs ``pip install "agent-ledger[postgres]"`` and PostgreSQL 14 or later.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import math
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, Final, Literal, LiteralString, TypeVar, overload
from urllib.parse import quote, urlencode, urlunsplit

import orjson
import psycopg
from psycopg import AsyncConnection, sql
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from agent_ledger.backoff import LISTENER_RECONNECT
from agent_ledger.codes import DecisionCode
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import (
    EffectInFlightError,
    EffectLedgerError,
    EffectLedgerInvariantError,
    EffectLedgerPermissionError,
    EffectLedgerValidationError,
    EffectStoreError,
)
from agent_ledger.ids import is_effect_id
from agent_ledger.observability import logger
from agent_ledger.options import DEFAULT_TX_LOCK_TIMEOUT_MS
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores import _postgres_partitions as part
from agent_ledger.stores import _postgres_queries as q
from agent_ledger.stores._columns import ROW_COLUMNS
from agent_ledger.stores._dedup import (
    DEFAULT_FLUSH_INTERVAL_S,
    CountsLost,
    PendingCounts,
    check_flush_interval,
    row_id,
    with_count,
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
from agent_ledger.stores._postgres_approvals import APPROVALS_TABLE, PostgresApprovals
from agent_ledger.stores._postgres_budgets import PostgresBudgets
from agent_ledger.stores._postgres_roles import PostgresRoles
from agent_ledger.stores._postgres_sagas import STEPS_TABLE, PostgresSagas
from agent_ledger.stores._postgres_tables import utc
from agent_ledger.stores._rows import (
    EFFECT_WIDTH,
    STATUS_BY_VALUE,
    effect_from_row,
    stats_from_groups,
)
from agent_ledger.stores._subscriptions import Subscribers, Subscription
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

__all__ = ["SCHEMA_SQL", "SCHEMA_VERSION", "PostgresStore"]

#: The schema this version of the library needs (see the marker table).
SCHEMA_VERSION: Final = 4
#: The text of ``schema.sql``; apply it with ``conn.execute(SCHEMA_SQL)``.
# Typed LiteralString so `conn.execute(SCHEMA_SQL)` type-checks: it is our own file.
SCHEMA_SQL: Final[LiteralString] = (
    resources.files("agent_ledger.stores").joinpath("postgres_schema.sql").read_text("utf-8")
)
EFFECTS_TABLE: Final = "agent_ledger_effects"
VERSIONS_TABLE: Final = "agent_ledger_schema_version"
LEGACY_KEYS_TABLE: Final = "agent_ledger_legacy_keys"
NOTIFY_CHANNEL: Final = "agent_ledger"

_PROCESSING: Final = EffectStatus.PROCESSING.value
#: A duplicate of an effect in one of these is only read by begin, and counted later.
_FINISHED: Final = sorted(s.value for s in TERMINAL)
_FINISHED_VALUES: Final = frozenset(_FINISHED)
_STATUS_AT: Final = ROW_COLUMNS.index("status")
_ID_AT: Final = ROW_COLUMNS.index("id")
_DEDUP_AT: Final = ROW_COLUMNS.index("dedup_count")
#: How many keys a store remembers having begun (see ``PostgresStore.begin``).
_KNOWN_KEYS: Final = 10_000
_STATUS_BY_VALUE: Final = STATUS_BY_VALUE

_T = TypeVar("_T")

#: Columns of EFFECT_COLUMNS; a query may add one more (begin's and claim's flag).
_EFFECT_WIDTH: Final = EFFECT_WIDTH

# Connection used by an operation: the caller's transaction, or the pool's.
Connection = AsyncConnection[Any]
#: A statement as the store keeps it: its text rendered once (``_rendered``).
Statement = bytes | sql.Composed


def _rendered(statement: sql.Composed) -> Statement:
    """``statement`` (its names filled in) as the bytes psycopg would send, once.

    psycopg renders a ``Composed`` again on every execute (each identifier
    escaped, the parts joined): a few µs of every step. An ASCII text is the
    same bytes in every client encoding, so it is rendered here for good; a
    schema name outside ASCII keeps the ``Composed``, rendered per connection.
    """
    text = statement.as_bytes(None)
    return text if text.isascii() else statement


def _effect_from_row(row: tuple[Any, ...]) -> Effect:
    return effect_from_row(row, utc)


def _error_json(error: EffectError | None) -> str | None:
    if error is None:
        return None
    return orjson.dumps({"message": error.message, "code": error.code}).decode()


def _status_list(statuses: Iterable[EffectStatus]) -> list[str]:
    return [s.value for s in statuses]


def _error_param(error: EffectError | None) -> dict[str, object]:
    return {"error": _error_json(error)}


def _as_stored(moment: datetime) -> datetime:
    return moment


_DIALECT: Final = Dialect(statuses=_status_list, error=_error_param, moment=_as_stored)


def _connection_lost(exc: psycopg.OperationalError, conn: Connection) -> bool:
    """Whether ``exc`` means the connection is gone (killed backend, server restart)."""
    lost = (psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown)
    return isinstance(exc, lost) or conn.broken or conn.closed


#: libpq options whose value must be a whole number (``port``: one per host).
_INTEGER_OPTIONS: Final = ("port", "connect_timeout", "keepalives_idle", "keepalives_interval")


def check_conninfo(conninfo: str, *, field: str = "conninfo") -> None:
    """Refuse a connection string libpq can never use, naming ``field``.

    libpq rejects an unknown parameter, and a port or timeout that is not a
    number, only when it connects. The pool then logs the same error on
    every retry until its timeout, and the probe's own ``connect_timeout``
    would hide a bad one: so they are checked here, before any connection.
    """
    from psycopg.conninfo import conninfo_to_dict

    try:
        options = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise EffectLedgerValidationError(
            f"malformed PostgreSQL connection string: {exc}", field=field
        ) from None
    for name in _INTEGER_OPTIONS:
        value = options.get(name)
        if value is not None and not all(part.strip().isdigit() for part in str(value).split(",")):
            raise EffectLedgerValidationError(
                f"malformed PostgreSQL connection string: {name} must be a number, got {value!r}",
                field=field,
            )


async def _behind_pooler(conn: Connection) -> bool:
    """Whether ``conn`` reaches PostgreSQL through a pooler (PgBouncer, Supavisor, ...).

    A server announces its backend's process id when a connection starts; a
    pooler hands the client a key of its own instead (it must: its client
    is not tied to one backend), so the pid the connection was given differs
    from the one the statement runs in. One round trip, not prepared.
    """
    cursor = await conn.execute("SELECT pg_backend_pid()", prepare=False)
    row = await cursor.fetchone()
    return row is not None and row[0] != conn.info.backend_pid


async def _probe(conninfo: str, timeout_s: float) -> bool:
    """Connect once, directly, and raise ``EffectStoreError`` with the reason if that fails.

    Returns whether the connection goes through a pooler (``_behind_pooler``).

    A pool never fails on a bad URL: it logs each failed attempt and keeps
    trying until its own timeout, then raises ``PoolTimeout``, which does not
    say why. One direct connection first turns "database does not exist",
    "connection refused" or a failed login into an immediate error that
    names the cause.
    """
    try:
        async with asyncio.timeout(timeout_s):
            # libpq's connect_timeout counts whole seconds, at least 2.
            conn = await AsyncConnection.connect(
                conninfo, connect_timeout=max(2, math.ceil(timeout_s)), autocommit=True
            )
    except TimeoutError:
        raise EffectStoreError(
            f"no answer from PostgreSQL within {timeout_s:g} s", operation="connect"
        ) from None
    except psycopg.Error as exc:
        # libpq's message may run over several lines ("Is the server running...?").
        reason = " ".join(str(exc).split())
        raise EffectStoreError(
            f"cannot connect to PostgreSQL: {reason}", operation="connect"
        ) from exc
    async with conn:
        try:
            return await _behind_pooler(conn)
        except psycopg.Error as exc:
            raise EffectStoreError(
                f"{type(exc).__name__}: {exc}".strip(), operation="connect"
            ) from exc


async def _restore_transactional(conn: Connection) -> None:
    """Switch a pool connection the store had put in autocommit back, for the pool's
    other users, or close it if that cannot be done.

    It must never raise: this runs on the way out of every step, and an error
    here would replace the step's own (a lost connection would no longer be
    recognised as one, and the step not retried on a live connection). A
    connection that is gone needs nothing: the pool discards it. One that
    cannot be switched back (a statement interrupted by a cancellation, say)
    is closed, so the pool replaces it rather than hand the application an
    autocommit connection it did not ask for.
    """
    if conn.closed:
        return
    try:
        await conn.set_autocommit(False)
    except psycopg.Error:
        await conn.close()


def schema_sql(*, partitioned: bool) -> LiteralString:
    """``SCHEMA_SQL`` as applied to a schema whose effects table is (not) partitioned.

    On a partitioned one, without the unique index on idem_key that
    PostgreSQL refuses there (``_postgres_partitions.PLAIN_ONLY_INDEX``).
    """
    if not partitioned:
        return SCHEMA_SQL
    if part.PLAIN_ONLY_INDEX not in SCHEMA_SQL:
        raise EffectLedgerInvariantError("postgres_schema.sql no longer has its idem_key index")
    return SCHEMA_SQL.replace(part.PLAIN_ONLY_INDEX, "")


#: Steps only the approver role may take (its privileges, not the worker's):
#: a refusal of one of them is a refusal to decide.
_APPROVER_STEPS: Final = frozenset({"decide", "settle", "reopen", "record_attempt"})
#: What the role set's triggers put in a refusal's constraint name.
_REFUSALS: Final = {
    DecisionCode.NOT_AN_APPROVER.value: DecisionCode.NOT_AN_APPROVER,
    DecisionCode.SELF_DECISION.value: DecisionCode.SELF_DECISION,
    DecisionCode.UNKNOWN_REQUESTER.value: DecisionCode.UNKNOWN_REQUESTER,
}


def _permission_error(
    exc: psycopg.errors.InsufficientPrivilege,
    operation: str,
    idem_key: str | None,
    effect_id: str | None,
) -> EffectLedgerPermissionError:
    """SQLSTATE 42501 as ``EffectLedgerPermissionError``: the role set's trigger's
    refusal (its constraint name is the code, its hint the GRANT), or a missing
    privilege, with the role the step needs."""
    diag = exc.diag
    code = _REFUSALS.get(diag.constraint_name or "")
    message = (diag.message_primary or str(exc)).strip()
    grant = diag.message_hint
    if code is None and operation in _APPROVER_STEPS:
        code = DecisionCode.NOT_AN_APPROVER
    if code is DecisionCode.NOT_AN_APPROVER:
        advice = grant or "GRANT the role set's approver role to this login role"
        message += f". To let this login decide: {advice} (docs/postgres.md, Roles)"
    elif operation == "install_roles":
        message += (
            ". Installing the role set needs a role that may create roles and owns the "
            "ledger's tables: a superuser, or the tables' owner with CREATEROLE"
        )
    elif code is None:
        message += (
            ". The role set (agent-ledger init --roles; docs/postgres.md, Roles) gives the "
            "engine's steps to its worker role, decisions to its approver role, and schema "
            "changes and purge to its owner role: GRANT the one this step needs"
        )
    return EffectLedgerPermissionError(
        message,
        operation=operation,
        code=None if code is None else code.value,
        grant=grant,
        idem_key=idem_key,
        effect_id=effect_id,
    )


def _no_partition(exc: EffectStoreError) -> bool:
    """Did an insert find no partition for its row (a partitioned table's CheckViolation)?"""
    cause = exc.__cause__
    return isinstance(cause, psycopg.errors.CheckViolation) and "no partition of relation" in str(
        cause
    )


class _DriverErrors:
    """``PostgresStore._errors(...)``: a driver error (``psycopg.Error``) raised
    inside becomes the store's error for the step (``_store_error``), chained
    to it; the library's own errors and any other exception pass unchanged.

    A class rather than a generator-based context manager: every statement
    enters one, and this costs a fraction of a generator's set-up.
    """

    __slots__ = ("_effect_id", "_idem_key", "_operation", "_store")

    def __init__(
        self,
        store: PostgresStore,
        operation: str,
        idem_key: str | None,
        effect_id: str | None,
    ) -> None:
        self._store = store
        self._operation = operation
        self._idem_key = idem_key
        self._effect_id = effect_id

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        # Ours already (EffectLedgerError is never a psycopg.Error): never double-wrap.
        if isinstance(exc, psycopg.Error):
            raise self._store._store_error(
                exc, self._operation, self._idem_key, self._effect_id
            ) from exc


class PostgresStore(
    LegacyStoreMethods, PostgresSagas, PostgresBudgets, PostgresApprovals, PostgresRoles
):
    """Effects in PostgreSQL, shared by every worker that uses the same database.

    ``pool`` is the caller's ``psycopg_pool.AsyncConnectionPool`` (opened by
    the caller, and closed by the caller unless the store was made with
    :meth:`connect`). Pool connections are switched to autocommit for the
    duration of each step, so every step is exactly one statement; create
    the pool with ``kwargs={"autocommit": True}`` to skip even that.
    ``schema`` is where the tables live (validated; only ever quoted as an
    identifier).

    Duplicates are counted in memory and written every
    ``dedup_flush_interval_s`` seconds in one statement for all keys, on
    :meth:`flush_counts` and on :meth:`close`, so that a replay is one read
    (``stores/_dedup.py`` says what a reader sees and what a crash may lose).

    Behind a pooler in transaction mode (PgBouncer, a managed proxy), every
    step works, since each is one statement or one transaction, but two
    things need a session: ``LISTEN``, and server-side prepared statements.
    ``listen_dsn`` is a direct connection string for the notification
    listener; without one, a listener that finds itself behind a pooler
    stops, and waiters poll on their backoff. The pool's connections must not
    prepare statements (``kwargs={"prepare_threshold": None}``; :meth:`connect`
    sets it when it detects a pooler).
    """

    #: How settle's parameters are spelled here (for the approval steps' ``decide``).
    _dialect = _DIALECT

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        schema: str = "public",
        dedup_flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        listen_dsn: str | None = None,
        partitioned: bool | None = None,
        _owns_pool: bool = False,
    ) -> None:
        if not isinstance(schema, str) or not schema or len(schema.encode()) > 63:
            raise EffectLedgerValidationError(
                f"schema must be a PostgreSQL identifier of 1 to 63 bytes, got {schema!r}",
                field="schema",
            )
        if listen_dsn is not None and (not isinstance(listen_dsn, str) or not listen_dsn.strip()):
            raise EffectLedgerValidationError(
                f"listen_dsn must be a PostgreSQL connection string, got {listen_dsn!r}",
                field="listen_dsn",
            )
        if partitioned is not None and not isinstance(partitioned, bool):
            raise EffectLedgerValidationError(
                f"partitioned must be True, False or None, got {partitioned!r}",
                field="partitioned",
            )
        interval_s = check_flush_interval(dedup_flush_interval_s)
        self._pool = pool
        self._owns_pool = _owns_pool
        self.schema = schema
        effects = sql.Identifier(schema, EFFECTS_TABLE)
        versions = sql.Identifier(schema, VERSIONS_TABLE)
        legacy_keys = sql.Identifier(schema, LEGACY_KEYS_TABLE)
        approvals = sql.Identifier(schema, APPROVALS_TABLE)

        def compose(text: LiteralString) -> Statement:
            return _rendered(
                sql.SQL(text).format(
                    effects=effects, versions=versions, legacy_keys=legacy_keys, approvals=approvals
                )
            )

        self._begin = compose(q.BEGIN)
        self._begin_in_transaction = compose(q.BEGIN_IN_TRANSACTION)
        self._count_waiting = compose(q.COUNT_WAITING)
        self._claim = compose(q.CLAIM)
        self._claim_in_transaction = compose(q.CLAIM_IN_TRANSACTION)
        self._heartbeat = compose(q.HEARTBEAT)
        self._commit = compose(q.COMMIT)
        self._record_try = compose(q.RECORD_TRY)
        self._release = compose(q.RELEASE)
        self._transition = compose(q.TRANSITION)
        self._reopen = compose(q.REOPEN)
        self._retry_failed = compose(q.RETRY_FAILED)
        self._mark_started = compose(q.MARK_STARTED)
        self._park = compose(q.PARK)
        self._settle = compose(q.SETTLE)
        self._get = compose(q.GET)
        self._find = compose(q.FIND)
        self._find_legacy = compose(q.FIND_LEGACY)
        self._record_legacy = compose(q.RECORD_LEGACY)
        self._schema_version = compose(q.SCHEMA_VERSION_AND_KIND)
        self._stats = compose(q.STATS)
        self._purge = _rendered(
            sql.SQL(q.PURGE).format(effects=effects, steps=sql.Identifier(schema, STEPS_TABLE))
        )
        self._dedup_flush = compose(q.DEDUP_FLUSH)
        self._dedup_counts = compose(q.DEDUP_COUNTS)
        self._counts = PendingCounts(
            self._write_counts, interval_s=interval_s, store=f"PostgresStore({schema})"
        )
        self._effects = effects
        #: Keys this store has begun, oldest first: a begin of one of them
        #: tries a plain read first (a replay, most likely).
        self._known: dict[str, None] = {}
        self._listener = _Listener(pool, schema, listen_dsn)
        self._beats = _ReservedConnection(pool)
        #: What the caller asked for (None: whatever the catalogue says), and
        #: what the catalogue said (None: not asked yet); see _partitioning.
        self._wants_partitioned = partitioned
        self._partitioned: bool | None = None
        keys = sql.Identifier(schema, part.KEYS_TABLE)
        self._p_names = {
            "effects": effects,
            "keys": keys,
            "steps": sql.Identifier(schema, STEPS_TABLE),
            "partitions": sql.Identifier(schema, "agent_ledger_effect_partitions"),
            "add": sql.Identifier(schema, "agent_ledger_add_partitions"),
            "partition": sql.Identifier(schema, "agent_ledger_partition_effects"),
        }

        def compose_partitioned(text: LiteralString) -> Statement:
            return _rendered(sql.SQL(text).format(**self._p_names))

        self._p_begin = compose_partitioned(part.BEGIN)
        self._p_begin_in_transaction = compose_partitioned(part.BEGIN_IN_TRANSACTION)
        self._p_find = compose_partitioned(part.FIND)
        self._p_reclaim = compose_partitioned(part.RECLAIM_KEY)
        self._p_add_now = compose_partitioned(part.ADD_PARTITIONS_NOW)
        self._plain_statements = (self._begin, self._begin_in_transaction, self._find)

    @classmethod
    async def connect(
        cls,
        conninfo: str,
        *,
        schema: str = "public",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 30.0,
        dedup_flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        listen_dsn: str | None = None,
        partitioned: bool | None = None,
    ) -> PostgresStore:
        """Open a pool of autocommit connections that the store owns and closes.

        Raises ``EffectStoreError`` if ``min_size`` connections cannot be made
        within ``connect_timeout`` seconds. A server that refuses the
        connection (no such database or role, a closed port, an unknown host)
        fails at once, with the server's own message. A connection string
        libpq cannot use (an unknown parameter, a port that is not a number)
        raises ``EffectLedgerValidationError`` before connecting.

        When ``conninfo`` leads to a pooler (``_behind_pooler``), the pool's
        connections never prepare statements (``prepare_threshold=None``): a
        statement prepared in one pooled transaction's server connection is
        unknown to the next one's. ``listen_dsn``: see the class.
        """
        check_flush_interval(dedup_flush_interval_s)
        check_conninfo(conninfo)
        deadline = asyncio.get_running_loop().time() + connect_timeout
        pooled = await _probe(conninfo, connect_timeout)
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.1)
        kwargs: dict[str, Any] = {"autocommit": True}
        if pooled:
            kwargs["prepare_threshold"] = None
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            conninfo, min_size=min_size, max_size=max_size, kwargs=kwargs, open=False
        )
        try:
            await pool.open(wait=True, timeout=remaining)
        except Exception as exc:
            await pool.close()
            raise EffectStoreError(f"{type(exc).__name__}: {exc}", operation="connect") from exc
        return cls(
            pool,
            schema=schema,
            dedup_flush_interval_s=dedup_flush_interval_s,
            listen_dsn=listen_dsn,
            partitioned=partitioned,
            _owns_pool=True,
        )

    # -- schema ----------------------------------------------------------------

    async def create_schema(self) -> None:
        """Create the schema (if needed) and apply ``SCHEMA_SQL`` inside it; idempotent.

        ``migrate()`` does the same and says what it did.
        """
        await self._migrate("create_schema")

    async def migrate(self) -> SchemaMigration:
        """Create or upgrade the tables (see ``Store.migrate``); what version it found and left.

        Applies ``SCHEMA_SQL``, whose sections each upgrade a version once,
        in one transaction: a failure leaves the schema as it was.
        """
        return await self._migrate("migrate")

    async def _migrate(self, operation: str) -> SchemaMigration:
        versions = sql.Identifier(self.schema, VERSIONS_TABLE)
        with self._errors(operation):
            async with self._pool.connection() as conn, conn.transaction():
                # Several workers may run this at start-up, and even the IF NOT
                # EXISTS forms race on the catalog: take turns, first thing.
                # So the version read next is the one this call will upgrade.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agent_ledger_schema'))")
                found = await self._version_in(conn, versions)
                self._refuse_newer(found)
                await conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
                )
                await conn.execute(
                    sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(self.schema))
                )
                partitioned = await self._is_partitioned(conn)
                await conn.execute(schema_sql(partitioned=bool(partitioned)))
                if partitioned or self._wants_partitioned:
                    await conn.execute(part.PARTITIONED_SQL)
                if self._wants_partitioned and not partitioned:
                    await self._partition_in(conn, period="month", ahead=3, convert=False)
                left = await self._version_in(conn, versions)
        self._partitioned = None  # read the catalogue again at the next step
        return SchemaMigration(found, left)

    def _refuse_newer(self, found: int) -> None:
        """A schema newer than this library was migrated by a newer release: refuse it."""
        if found > SCHEMA_VERSION:
            raise EffectStoreError(
                f"schema {self.schema!r} is at agent-ledger version {found}, newer than this "
                f"library's {SCHEMA_VERSION}: a newer release migrated it. Upgrade "
                "agent-ledger to use it; this version would misread its rows.",
                operation="check_schema",
            )

    @staticmethod
    async def _version_in(conn: Connection, versions: sql.Identifier) -> int:
        """The schema version ``conn`` sees; 0 when there are no tables yet."""
        name = versions.as_string(conn)
        cursor = await conn.execute(q.HAS_VERSIONS_TABLE, {"name": name})
        row = await cursor.fetchone()
        if row is None or not row[0]:
            return 0
        cursor = await conn.execute(sql.SQL(q.SCHEMA_VERSION).format(versions=versions))
        row = await cursor.fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def _init_command(self) -> str:
        """``agent-ledger init --url '...'`` for this store's database and schema.

        Built from the pool's connection string without its password (an
        error message must not carry one), so the command can be pasted
        where a password comes from ``PGPASSWORD`` or ``~/.pgpass``.
        """
        from psycopg.conninfo import conninfo_to_dict

        conninfo = self._pool.conninfo  # a callable when the pool computes it per connection
        try:
            options = (
                {k: str(v) for k, v in conninfo_to_dict(conninfo).items()}
                if isinstance(conninfo, str)
                else {}
            )
        except psycopg.Error:
            options = {}
        user, host = options.pop("user", ""), options.pop("host", "")
        port, dbname = options.pop("port", ""), options.pop("dbname", "")
        options.pop("password", None)
        netloc = (f"{quote(user)}@" if user else "") + host + (f":{port}" if port else "")
        query = urlencode({**options, "schema": self.schema})
        url = urlunsplit(("postgresql", netloc, f"/{quote(dbname)}" if dbname else "/", query, ""))
        return f"`agent-ledger init --url '{url}'`"

    async def check_schema(self) -> int:
        """The schema version in the database; raises with a fix if it is missing or old."""
        with self._errors("check_schema"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(
                    self._schema_version, {"name": self._effects.as_string(conn)}
                )
                row = await cursor.fetchone()
        version = row[0] if row is not None else None
        if version is not None:
            self._refuse_newer(int(version))
            if self._partitioned is None and row is not None and row[1] is not None:
                # Learnt with the version: the first begin need not ask the catalogue.
                self._choose_statements(bool(row[1]))
        if version is None or version < SCHEMA_VERSION:
            fix = (
                f"create them with {self._init_command()} (or await store.create_schema(), "
                "or apply schema.sql there)"
                if version is None
                else "run `agent-ledger migrate` (or await store.migrate(), or apply schema.sql)"
            )
            raise EffectStoreError(
                f"schema {self.schema!r} is at version {version}, this library needs "
                f"{SCHEMA_VERSION}: {fix}",
                operation="check_schema",
            )
        return int(version)

    # -- ledger steps -----------------------------------------------------------

    async def begin(
        self, new: NewEffect, *, tx: object | None = None, lock_timeout_ms: int | None = None
    ) -> BeginOutcome:
        if self._partitioned is None:
            await self._partitioning()
        if tx is not None:
            return await self._begin_inside(tx, new, begin_params(new), lock_timeout_ms)
        key = new.idem_key
        counts = self._counts
        known = self._known
        if key in known:
            # Seen here before: most likely a replay, and a plain read is the
            # cheapest answer (no insert or update to set up on the server).
            # Anything but a finished effect goes on to BEGIN as usual.
            started = counts.epoch
            row = await self._pooled("begin", self._find, {"idem_key": key}, True, key, None)
            if row is not None and row[_STATUS_AT] in _FINISHED_VALUES:
                return await self._replayed(row, started)
        elif len(known) >= _KNOWN_KEYS:
            del known[next(iter(known))]
        known[key] = None
        params = begin_params(new)
        params["lock_timeout"] = None if lock_timeout_ms is None else f"{lock_timeout_ms}ms"
        # Twice at most in practice: nothing comes back only when a first
        # insert of the key committed after the statement's snapshot (BEGIN),
        # and the next snapshot sees it, or when an open effect finished
        # between BEGIN and COUNT_WAITING; a third try covers a purge between.
        for _ in range(3):
            started = counts.epoch
            try:
                row = await self._lock_bounded("begin", self._begin, params, lock_timeout_ms, key)
            except EffectStoreError as exc:
                if not (self._partitioned and _no_partition(exc)):
                    raise
                await self._add_partitions_now()
                continue
            if row is None:
                if self._partitioned:
                    await self._execute("begin", self._p_reclaim, {"idem_key": key}, None)
                continue
            if row[_EFFECT_WIDTH]:
                return BeginOutcome(_effect_from_row(row), created=True)
            if row[_STATUS_AT] not in _FINISHED_VALUES:
                # Open: this caller may wait for it, so its duplicate counts now.
                started = counts.epoch
                waiting = {
                    "id": row[_ID_AT],
                    "finished": _FINISHED,
                    "lock_timeout": params["lock_timeout"],
                }
                row = await self._lock_bounded(
                    "begin", self._count_waiting, waiting, lock_timeout_ms, key
                )
                if row is None:
                    continue  # finished (or purged) meanwhile: read it again
                (row,) = await self._counted([row], started, None)
                return BeginOutcome(_effect_from_row(row), created=False)
            return await self._replayed(row, started)
        raise EffectStoreError(
            "the effect this key conflicted with was not found three times "
            "(purged meanwhile?); call again",
            operation="begin",
            idem_key=key,
        )

    async def _replayed(self, row: tuple[Any, ...], started: int) -> BeginOutcome:
        """begin's answer for a finished effect's ``row``, read from epoch ``started``:
        counted later (a batch, ``PendingCounts``), and only now that the answer is
        certain (a replay that raises counts nothing); the row comes back with this
        process's unwritten duplicates and this one added to its ``dedup_count``.
        """
        counts = self._counts
        effect_id = row_id(row)
        if counts.ambiguous((row,), started):
            # A flush of it overlapped the read: its count is read again.
            (row,) = await self._counted([row], started, None)
            extra = 1
        else:
            extra = counts.unwritten(effect_id) + 1
        counts.add(effect_id)
        return BeginOutcome(
            _effect_from_row(with_count(row, row[_DEDUP_AT] + extra)), created=False
        )

    async def _begin_inside(
        self, tx: object, new: NewEffect, params: dict[str, object], lock_timeout_ms: int | None
    ) -> BeginOutcome:
        """``begin`` inside a caller's transaction: insert, or only read (see
        ``BEGIN_IN_TRANSACTION``), waiting for no lock longer than the bound."""
        key = new.idem_key
        started = self._counts.epoch
        try:
            row = await self._bounded(
                "begin", self._begin_in_transaction, params, tx, lock_timeout_ms, key
            )
        except EffectStoreError as exc:
            if not (self._partitioned and _no_partition(exc)):
                raise
            # The savepoint undid the failed insert; the partition is made
            # on a connection of its own, and the insert tried once more.
            await self._add_partitions_now()
            row = await self._bounded(
                "begin", self._begin_in_transaction, params, tx, lock_timeout_ms, key
            )
        if row is not None:
            created = bool(row[_EFFECT_WIDTH])
            if not created:
                (row,) = await self._counted([row], started, tx)
            return BeginOutcome(_effect_from_row(row), created=created)
        # The key was inserted by a transaction that committed after this
        # statement began (the insert waited for it): read it with a fresh snapshot.
        started = self._counts.epoch
        row = await self._fetch_one("begin", self._find, {"idem_key": key}, tx, idem_key=key)
        if row is None:
            raise EffectStoreError(
                "the effect this key conflicted with is gone (purged meanwhile?); call again",
                operation="begin",
                idem_key=key,
            )
        (row,) = await self._counted([row], started, tx)
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
        if tx is not None:
            row = await self._bounded(
                "claim", self._claim_in_transaction, params, tx, lock_timeout_ms, idem_key
            )
        else:
            params["lock_timeout"] = None if lock_timeout_ms is None else f"{lock_timeout_ms}ms"
            row = await self._lock_bounded("claim", self._claim, params, lock_timeout_ms, idem_key)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        claimed = bool(row[_EFFECT_WIDTH])
        (row,) = await self._counted([row], started, tx)
        return ClaimOutcome(_effect_from_row(row), claimed=claimed)

    async def heartbeat(self, held: Sequence[Held]) -> HeartbeatOutcome:
        batch = [one for one in held if is_effect_id(one.effect_id)]
        if not batch:
            return HeartbeatOutcome(frozenset())
        params = {
            "ids": [one.effect_id for one in batch],
            "attempts": [one.attempt for one in batch],
            "processing": _PROCESSING,
        }

        async def beat(conn: Connection) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(self._heartbeat, params)
            return await cursor.fetchall()

        effect_id = batch[0].effect_id if len(batch) == 1 else None
        with self._errors("heartbeat", effect_id=effect_id):
            rows = await self._beats.run(beat)
        refreshed = frozenset(Held(id_, attempt) for id_, attempt, fresh in rows if fresh)
        busy = frozenset(Held(id_, attempt) for id_, attempt, fresh in rows if not fresh)
        return HeartbeatOutcome(refreshed, busy)

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
        return await self._execute("commit", self._commit, params, tx, effect_id=effect_id)

    async def record_try(
        self, effect_id: str, *, attempt: int, error: EffectError, error_type: str
    ) -> bool:
        if not is_effect_id(effect_id):
            return False
        params = record_try_params(effect_id, attempt=attempt, error=error, error_type=error_type)
        return await self._execute(
            "record_try", self._record_try, params, None, effect_id=effect_id
        )

    async def release(self, effect_id: str, *, attempt: int, for_approval: bool = False) -> bool:
        if not is_effect_id(effect_id):
            return False
        params = release_params(effect_id, attempt=attempt, for_approval=for_approval)
        return await self._execute("release", self._release, params, None, effect_id=effect_id)

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
        return await self._effect_of(
            self._fetch_one("transition", self._transition, params, tx, idem_key=idem_key), tx
        )

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> Effect | None:
        params = reopen_params(_DIALECT, idem_key, by=by, reason=reason)
        return await self._effect_of(
            self._fetch_one("reopen", self._reopen, params, None, idem_key=idem_key), None
        )

    async def retry_failed(self, idem_key: str, *, attempt: int, lease_ms: int) -> ClaimOutcome:
        params = retry_failed_params(_DIALECT, idem_key, attempt=attempt, lease_ms=lease_ms)
        started = self._counts.epoch
        row = await self._fetch_one(
            "retry_failed", self._retry_failed, params, None, idem_key=idem_key
        )
        if row is None:
            return ClaimOutcome(None, claimed=False)
        claimed = bool(row[_EFFECT_WIDTH])
        (row,) = await self._counted([row], started, None)
        return ClaimOutcome(_effect_from_row(row), claimed=claimed)

    async def mark_started(
        self, effect_id: str, *, attempt: int, worker: str, tx: object | None = None
    ) -> bool:
        if not is_effect_id(effect_id):
            return False
        params = mark_started_params(effect_id, attempt=attempt, worker=worker)
        return await self._execute(
            "mark_started", self._mark_started, params, tx, effect_id=effect_id
        )

    async def park(self, idem_key: str, *, stale_after_ms: int, error: EffectError) -> ClaimOutcome:
        params = park_params(_DIALECT, idem_key, stale_after_ms=stale_after_ms, error=error)
        started = self._counts.epoch
        row = await self._fetch_one("park", self._park, params, None, idem_key=idem_key)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        parked = bool(row[_EFFECT_WIDTH])
        (row,) = await self._counted([row], started, None)
        return ClaimOutcome(_effect_from_row(row), claimed=parked)

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
        return await self._effect_of(
            self._fetch_one("settle", self._settle, params, None, idem_key=idem_key), None
        )

    async def get(self, effect_id: str, *, tx: object | None = None) -> Effect | None:
        if not is_effect_id(effect_id):
            return None
        return await self._effect_of(
            self._fetch_one("get", self._get, {"id": effect_id}, tx, effect_id=effect_id), tx
        )

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        params = {"idem_key": idem_key}
        return await self._effect_of(
            self._fetch_one("find", self._find, params, tx, idem_key=idem_key), tx
        )

    async def find_legacy(self, legacy_key: str, *, tx: object | None = None) -> Effect | None:
        params = {"legacy_key": legacy_key}
        return await self._effect_of(
            self._fetch_one("find_legacy", self._find_legacy, params, tx), tx
        )

    async def record_legacy(self, legacy_key: str, idem_key: str) -> bool:
        """As ``MemoryStore.record_legacy``: map 0.2.x's key to ours; False if mapped already."""
        params = {"legacy_key": legacy_key, "idem_key": idem_key}
        return await self._execute("record_legacy", self._record_legacy, params, None)

    # -- audit --------------------------------------------------------------------

    async def list_effects(self, query: EffectQuery | None = None) -> list[Effect]:
        if query is None:
            return await all_effects(self)  # 0.2.x's bare call
        if query.before is not None and not is_effect_id(query.before[1]):
            raise EffectLedgerValidationError("cursor names no effect", field="cursor")
        names, params = list_params(_DIALECT, query)
        filters = [q.LIST_FILTERS[name] for name in names]
        statement = sql.SQL(q.LIST).format(effects=self._effects)
        if filters:
            where = sql.SQL(" AND ").join(sql.SQL(f) for f in filters)
            statement = statement + sql.SQL(" WHERE ") + where
        statement = statement + sql.SQL(q.LIST_ORDER)
        started = self._counts.epoch
        with self._errors("list_effects"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(statement, params)
                rows = await cursor.fetchall()
        return [_effect_from_row(row) for row in await self._counted(rows, started, None)]

    async def stats(self) -> LedgerStats:
        """Counts over the table; its ``duplicates`` include this process's counts.

        It first writes the pending duplicate counts (so other processes see them
        too). Those the write left pending (a row another transaction holds
        locked is skipped, not waited for; or the write failed) are added to the
        totals, as every read adds them to the rows it returns: those of effects
        still stored, read after the totals (an effect purged in between is left
        out: low, never high).
        """
        with contextlib.suppress(EffectStoreError):
            await self.flush_counts()
        counts = self._counts
        async with counts.quiet():
            unwritten = counts.snapshot()
            with self._errors("stats"):
                async with self._connection(None) as conn:
                    cursor = await conn.execute(self._stats)
                    rows = await cursor.fetchall()
                    stored: list[tuple[str, int]] = []
                    if unwritten:
                        ids = list(unwritten)
                        cursor = await conn.execute(self._dedup_counts, {"ids": ids})
                        stored = await cursor.fetchall()
        totals = stats_from_groups((_STATUS_BY_VALUE[st], tool, n, d) for st, tool, n, d in rows)
        extra = sum(unwritten[effect_id] for effect_id, _ in stored)
        return dataclasses.replace(totals, duplicates=totals.duplicates + extra)

    async def purge(self, *, older_than: timedelta, statuses: frozenset[EffectStatus]) -> int:
        check_purge_statuses(statuses)
        params = {
            "statuses": _DIALECT.statuses(statuses),
            "older_ms": older_than / timedelta(milliseconds=1),
        }
        if await self._partitioning():
            return await self._purge_partitions(params)
        with self._errors("purge"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(self._purge, params)
                return cursor.rowcount

    # -- the partitioned variant (postgres_partitioned.sql) -------------------------

    async def partition(self, *, period: str = "month", ahead: int = 3) -> str:
        """Partition the effects table by ``created_at``; what it found.

        ``period`` is how long a partition spans (``"day"``, ``"week"`` or
        ``"month"``, in UTC), ``ahead`` how many periods past the current one
        get their partitions now (each purge makes them again). On a new or
        empty ledger it is instant. A ledger holding effects is converted
        in one transaction that keeps writers waiting while it copies every
        key to the key table and attaches the old table as one partition
        (docs/postgres.md: "A hundred million effects"). Returns
        ``"partitioned"``, or ``"already partitioned"`` (then nothing changes).
        Apply the schema first (``create_schema()``).
        """
        if period not in part.PERIODS:
            raise EffectLedgerValidationError(
                f"period must be one of {', '.join(part.PERIODS)}, got {period!r}",
                field="period",
            )
        if isinstance(ahead, bool) or not isinstance(ahead, int) or not 1 <= ahead <= 366:
            raise EffectLedgerValidationError(
                f"ahead must be a whole number of periods from 1 to 366, got {ahead!r}",
                field="ahead",
            )
        with self._errors("partition"):
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agent_ledger_schema'))")
                await conn.execute(
                    sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(self.schema))
                )
                if await self._is_partitioned(conn) is None:
                    raise EffectStoreError(
                        f"schema {self.schema!r} has no agent-ledger tables: create them first "
                        f"with {self._init_command()}",
                        operation="partition",
                    )
                await conn.execute(part.PARTITIONED_SQL)
                done = await self._partition_in(conn, period=period, ahead=ahead, convert=True)
        self._partitioned = None
        return done

    async def _partition_in(
        self, conn: Connection, *, period: str, ahead: int, convert: bool
    ) -> str:
        """Run the conversion function on ``conn`` (in its transaction). Without
        ``convert``, a table holding effects is refused, not converted."""
        if not convert:
            cursor = await conn.execute(sql.SQL(part.HAS_EFFECTS).format(**self._p_names))
            row = await cursor.fetchone()
            if row is not None and row[0]:
                raise EffectStoreError(
                    f"schema {self.schema!r} holds effects in an unpartitioned table; "
                    "converting it locks the table while every key is copied: run "
                    "`agent-ledger init --partitioned` (or await store.partition()) "
                    "when writers may wait (docs/postgres.md)",
                    operation="create_schema",
                )
        cursor = await conn.execute(
            sql.SQL(part.PARTITION_EFFECTS).format(**self._p_names),
            {"period": period, "ahead": ahead},
        )
        row = await cursor.fetchone()
        return str(row[0]) if row is not None else "partitioned"

    async def _is_partitioned(self, conn: Connection) -> bool | None:
        """Whether the effects table is partitioned; None when there is none."""
        name = self._effects.as_string(conn)
        cursor = await conn.execute(part.IS_PARTITIONED, {"name": name})
        row = await cursor.fetchone()
        return None if row is None or row[0] is None else bool(row[0])

    async def _partitioning(self) -> bool:
        """Whether the effects table is partitioned, read from the catalogue once
        (again after create_schema, migrate or partition), and the statements
        that differ chosen to match. A table that is not what the store was
        made for (``partitioned=``) is refused."""
        if self._partitioned is not None:
            return self._partitioned
        with self._errors("check_schema"):
            async with self._connection(None) as conn:
                found = await self._is_partitioned(conn)
        if found is None:
            return bool(self._wants_partitioned)  # no tables: the step fails on its own
        return self._choose_statements(found)

    def _choose_statements(self, found: bool) -> bool:
        """Use the statements for a (not) partitioned effects table, as ``found``;
        a table that is not what the store was made for is refused."""
        if self._wants_partitioned is not None and found != self._wants_partitioned:
            raise EffectStoreError(
                f"schema {self.schema!r} has a {'partitioned' if found else 'plain'} effects "
                f"table, and this store was made with partitioned={self._wants_partitioned}"
                + (
                    ": convert it with `agent-ledger init --partitioned` (docs/postgres.md)"
                    if not found
                    else ""
                ),
                operation="check_schema",
            )
        if found:
            self._begin, self._begin_in_transaction = self._p_begin, self._p_begin_in_transaction
            self._find = self._p_find
        else:
            self._begin, self._begin_in_transaction, self._find = self._plain_statements
        self._partitioned = found
        return found

    async def _add_partitions_now(self) -> None:
        """An insert found no partition for now: make it (and any missing before it)."""
        with self._errors("begin"):
            async with self._connection(None) as conn:
                await conn.execute(self._p_add_now)

    async def _purge_partitions(self, params: dict[str, object]) -> int:
        """``purge`` on the partitioned table (see postgres_partitioned.sql).

        Partitions wholly older than the cut-off whose every row goes are
        detached (CONCURRENTLY), their key rows deleted in batches, and
        dropped; the rest goes row by row. A partition that a person's
        reopen made hold a keeper between the check and the detach is
        attached again. Partitions a purge left detached (it was
        interrupted) are finished first, and the partitions ahead made.
        """
        names = self._p_names

        def q_(text: LiteralString, **more: sql.Composable) -> sql.Composed:
            return sql.SQL(text).format(**names, **more)

        purged = 0
        with self._errors("purge"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(part.CUTOFF, params)
                row = await cursor.fetchone()
                args = {**params, "cutoff": row[0] if row else None}
                table = self._effects.as_string(conn)
                cursor = await conn.execute(part.PENDING_DETACH, {"name": table})
                for (name,) in await cursor.fetchall():
                    await conn.execute(q_(part.FINALIZE, part=sql.Identifier(self.schema, name)))
                cursor = await conn.execute(part.LEFT_DETACHED, {"schema": self.schema})
                for (name,) in await cursor.fetchall():
                    where = sql.Identifier(self.schema, name)
                    bounds = await conn.execute(
                        part.DETACHED_BOUNDS, {"name": where.as_string(conn)}
                    )
                    lo, hi = await bounds.fetchone() or (None, None)
                    purged += await self._finish_detached(conn, where, args, lo, hi)
                await conn.execute(q_(part.ADD_PARTITIONS))
                cursor = await conn.execute(q_(part.OLD_PARTITIONS), args)
                for name, lo, hi in await cursor.fetchall():
                    where = sql.Identifier(self.schema, name)
                    kept = await conn.execute(q_(part.HAS_KEPT, part=where), args)
                    found = await kept.fetchone()
                    if found is None or found[0]:
                        continue  # row by row, below
                    await conn.execute(q_(part.DETACH, part=where))
                    purged += await self._finish_detached(conn, where, args, lo, hi)
                cursor = await conn.execute(q_(part.PURGE_ROWS), args)
                row = await cursor.fetchone()
                purged += int(row[0]) if row else 0
        return purged

    async def _finish_detached(
        self,
        conn: Connection,
        where: sql.Identifier,
        args: Mapping[str, object],
        lo: str | None,
        hi: str | None,
    ) -> int:
        """A partition this purge (or an interrupted one) detached: dropped with
        its key rows, or, if it holds something purge keeps (a person reopened
        an effect before the detach), attached again with its bounds, without
        the effects a begin superseded meanwhile. How many effects went."""
        names = self._p_names
        cursor = await conn.execute(sql.SQL(part.DETACHED_COUNT).format(**names, part=where), args)
        total, keepers = await cursor.fetchone() or (0, 0)
        if keepers:
            if hi is None:  # its bounds are unknown: left for a person
                logger.warning(
                    "purge left the detached partition %s: it holds effects purge keeps, "
                    "and no CHECK constraint says its bounds (attach it again by hand)",
                    where.as_string(conn),
                )
                return 0
            bounds = {
                "lo": sql.SQL("MINVALUE") if lo is None else sql.Literal(lo),
                "hi": sql.Literal(hi),
            }
            await conn.execute(sql.SQL(part.SUPERSEDED).format(**names, part=where))
            await conn.execute(sql.SQL(part.REATTACH).format(**names, part=where, **bounds))
            return 0
        return await self._drop_detached(conn, where, int(total))

    async def _drop_detached(self, conn: Connection, where: sql.Identifier, total: int) -> int:
        """Delete a detached partition's key rows in batches, then drop it; ``total``."""
        after = ""
        batch = sql.SQL(part.DELETE_KEYS).format(**self._p_names, part=where)
        while True:
            cursor = await conn.execute(batch, {"after": after, "limit": part.KEY_BATCH})
            row = await cursor.fetchone()
            if row is None or row[0] is None:
                break
            after = row[0]
        await conn.execute(sql.SQL(part.DROP).format(part=where))
        return total

    # -- transactions and notifications -------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A pool connection inside ``BEGIN ... COMMIT``, to pass as ``tx``.

        Failing to open or commit the transaction raises ``EffectStoreError``;
        an error raised inside the block (your own SQL included) propagates
        unchanged after the rollback.

        Your own psycopg ``AsyncConnection`` with an open transaction works
        as ``tx`` too; then your code decides when it commits.
        """
        body_failed = False
        try:
            async with self._pool.connection() as conn, conn.transaction():
                try:
                    yield conn
                except BaseException:
                    body_failed = True
                    raise
        except psycopg.Error as exc:
            if body_failed:
                raise  # the caller's own statement failed: theirs to see unchanged
            raise EffectStoreError(
                f"{type(exc).__name__}: {exc}".strip(), operation="transaction"
            ) from exc

    @asynccontextmanager
    async def subscribe(self, idem_key: str) -> AsyncIterator[Subscription]:
        async with self._listener.subscribers.subscribe(idem_key) as subscription:
            await self._listener.ensure_listening()
            yield subscription

    async def close(self) -> None:
        """Write the pending duplicate counts, stop the notification listener and close
        the heartbeat connection; close the pool if the store opened it.

        A failure to write the counts is logged, not raised, and loses them:
        call :meth:`flush_counts` first to see it. Using the store again
        afterwards opens what it needs again.
        """
        await self._counts.close()
        await self._listener.stop()
        await self._beats.close()
        if self._owns_pool:
            await self._pool.close()

    # -- duplicate counts --------------------------------------------------------

    async def flush_counts(self) -> None:
        """Write every duplicate this store counted so far, in one statement, now.

        Every other process then sees them (this one always does). Raises
        ``EffectStoreError`` if the write failed; the counts stay pending for
        the next flush, except when the reply was lost after the statement was
        sent (they are dropped rather than risk counting them twice). Rows
        another transaction holds locked are left for the next flush.
        Cancelling the caller does not cancel the write.
        """
        await self._counts.flush()

    async def _write_counts(self, batch: Mapping[str, int]) -> list[str]:
        """``DEDUP_FLUSH`` for ``batch`` (by effect id); the ids it skipped (locked rows)."""
        params = {"ids": list(batch), "counts": list(batch.values())}
        with self._errors("flush_counts"):
            async with self._connection(None) as conn:
                try:
                    cursor = await conn.execute(self._dedup_flush, params)
                    row = await cursor.fetchone()
                except psycopg.OperationalError as exc:
                    if _connection_lost(exc, conn):
                        raise CountsLost("the connection was lost") from exc
                    raise
        return [] if row is None else list(row[1])

    async def _counted(
        self, rows: list[tuple[Any, ...]], started: int, tx: object | None
    ) -> list[tuple[Any, ...]]:
        """``rows`` with this process's unwritten duplicates counted (``PendingCounts.counted``)."""
        return await self._counts.counted(rows, started, self._read_counts, tx)

    async def _read_counts(self, ids: list[str], tx: object | None) -> dict[str, int]:
        """The stored ``dedup_count`` of each of ``ids`` that still exists."""
        with self._errors("get"):
            async with self._connection(tx) as conn:
                cursor = await conn.execute(self._dedup_counts, {"ids": ids})
                return dict(await cursor.fetchall())

    async def _one_counted(self, row: tuple[Any, ...], started: int, tx: object | None) -> Effect:
        (row,) = await self._counted([row], started, tx)
        return _effect_from_row(row)

    # -- plumbing ---------------------------------------------------------------

    @asynccontextmanager
    async def _connection(self, tx: object | None) -> AsyncIterator[Connection]:
        if tx is not None:
            if not isinstance(tx, AsyncConnection):
                raise EffectLedgerValidationError(
                    "tx must be a psycopg AsyncConnection (e.g. from store.transaction())",
                    field="tx",
                )
            yield tx
            return
        async with self._pool.connection() as conn:
            if conn.autocommit:
                yield conn
                return
            # One statement needs no BEGIN/COMMIT round trips around it.
            await conn.set_autocommit(True)
            try:
                yield conn
            finally:
                await _restore_transactional(conn)

    def _errors(
        self, operation: str, *, idem_key: str | None = None, effect_id: str | None = None
    ) -> _DriverErrors:
        """The one place driver errors become ``EffectStoreError`` (``_DriverErrors``)."""
        return _DriverErrors(self, operation, idem_key, effect_id)

    def _store_error(
        self,
        exc: psycopg.Error,
        operation: str,
        idem_key: str | None,
        effect_id: str | None,
    ) -> EffectLedgerError:
        """What a driver error raised by step ``operation`` is raised as."""
        if isinstance(
            exc,
            psycopg.errors.InvalidSqlStatementName | psycopg.errors.DuplicatePreparedStatement,
        ):
            return EffectStoreError(
                f"{type(exc).__name__}: {exc}".strip() + ": a pooler in transaction mode "
                "between the pool and the server? Create the pool with "
                'kwargs={"prepare_threshold": None} (PostgresStore.connect() does it when '
                "it detects one)",
                operation=operation,
                idem_key=idem_key,
                effect_id=effect_id,
            )
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return _permission_error(exc, operation, idem_key, effect_id)
        if isinstance(exc, psycopg.errors.UndefinedTable):
            return EffectStoreError(
                f"the agent-ledger tables are missing from schema {self.schema!r}: create "
                f"them with {self._init_command()} (or await store.create_schema(), or "
                "apply schema.sql there)",
                operation=operation,
                idem_key=idem_key,
                effect_id=effect_id,
            )
        return EffectStoreError(
            f"{type(exc).__name__}: {exc}".strip(),
            operation=operation,
            idem_key=idem_key,
            effect_id=effect_id,
        )

    async def _fetch_one(
        self,
        operation: str,
        query: Statement,
        params: Mapping[str, object],
        tx: object | None,
        *,
        idem_key: str | None = None,
        effect_id: str | None = None,
    ) -> tuple[Any, ...] | None:
        """The row one statement of ``operation`` returns, or None (``_statement``)."""
        if tx is None:
            return await self._pooled(operation, query, params, True, idem_key, effect_id)

        async def fetch(conn: Connection) -> tuple[Any, ...] | None:
            cursor = await conn.execute(query, params)
            return await cursor.fetchone()

        return await self._statement(operation, fetch, tx, idem_key=idem_key, effect_id=effect_id)

    async def _effect_of(
        self, fetching: Awaitable[tuple[Any, ...] | None], tx: object | None
    ) -> Effect | None:
        """The effect ``fetching`` (a ``_fetch_one`` not yet awaited) reads, with this
        process's pending duplicate counts added; None when it reads no row."""
        started = self._counts.epoch
        row = await fetching
        return None if row is None else await self._one_counted(row, started, tx)

    async def _execute(
        self,
        operation: str,
        query: Statement,
        params: Mapping[str, object],
        tx: object | None,
        *,
        effect_id: str | None = None,
    ) -> bool:
        """Whether one statement of ``operation`` changed exactly one row (``_statement``)."""
        if tx is None:
            return await self._pooled(operation, query, params, False, None, effect_id)

        async def execute(conn: Connection) -> bool:
            cursor = await conn.execute(query, params)
            return cursor.rowcount == 1

        return await self._statement(operation, execute, tx, effect_id=effect_id)

    async def _lock_bounded(
        self,
        operation: str,
        query: Statement,
        params: Mapping[str, object],
        lock_timeout_ms: int | None,
        idem_key: str,
    ) -> tuple[Any, ...] | None:
        """One statement of ``operation`` outside any transaction that bounds its own
        lock wait (``LOCK_BOUND`` in ``_postgres_queries``, fed by the ``lock_timeout``
        parameter): a wait that ran out becomes ``EffectInFlightError``; the
        statement changed nothing, and its setting ended with it."""
        try:
            return await self._pooled(operation, query, params, True, idem_key, None)
        except EffectStoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise EffectInFlightError(idem_key, None, lock_timeout_ms=lock_timeout_ms) from None
            raise

    async def _bounded(
        self,
        operation: str,
        query: Statement,
        params: Mapping[str, object],
        tx: object,
        lock_timeout_ms: int | None,
        idem_key: str,
    ) -> tuple[Any, ...] | None:
        """One statement of ``operation`` inside the caller's transaction ``tx``,
        waiting at most ``lock_timeout_ms`` for a lock another transaction holds.

        Runs inside a savepoint with ``lock_timeout`` set around it
        (``LOCK_BOUND_*`` in ``_postgres_queries``): a lock wait that runs out
        becomes ``EffectInFlightError`` and, like any failure here, is rolled
        back to the savepoint, so the caller's transaction stays usable and
        keeps its own ``lock_timeout``. Costs two round trips more than the
        statement alone; only calls made with ``tx=`` pay them.
        """
        ms = max(DEFAULT_TX_LOCK_TIMEOUT_MS if lock_timeout_ms is None else lock_timeout_ms, 1)
        with self._errors(operation, idem_key=idem_key):
            async with self._connection(tx) as conn:
                if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
                    raise EffectLedgerValidationError(
                        "tx is an autocommit connection with no transaction open; pass "
                        "store.transaction()'s connection, or use your own inside "
                        "`async with conn.transaction():`",
                        field="tx",
                    )
                # lock_timeout 0 would mean "wait for ever": 1 ms is the shortest bound.
                cursor = await conn.execute(
                    sql.SQL(q.LOCK_BOUND_BEGIN).format(lock_timeout=sql.Literal(f"{ms}ms"))
                )
                cursor.nextset()  # past the SAVEPOINT's result, to the SELECT's
                prior = await cursor.fetchone()
                if prior is None:
                    raise EffectStoreError("set_config returned no row", operation=operation)
                try:
                    cursor = await conn.execute(query, params)
                    row = await cursor.fetchone()
                except psycopg.errors.LockNotAvailable:
                    await conn.execute(q.LOCK_BOUND_UNDO)
                    raise EffectInFlightError(idem_key, None, lock_timeout_ms=ms) from None
                except BaseException:
                    # CancelledError too: undo what can be undone; the original
                    # error is the one to report.
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute(q.LOCK_BOUND_UNDO)
                    raise
                await conn.execute(sql.SQL(q.LOCK_BOUND_END).format(prior=sql.Literal(prior[0])))
                return row

    @overload
    async def _pooled(
        self,
        operation: str,
        query: Statement,
        params: Mapping[str, object],
        fetch: Literal[True],
        idem_key: str | None,
        effect_id: str | None,
    ) -> tuple[Any, ...] | None: ...

    @overload
    async def _pooled(
        self,
        operation: str,
        query: Statement,
        params: Mapping[str, object],
        fetch: Literal[False],
        idem_key: str | None,
        effect_id: str | None,
    ) -> bool: ...

    async def _pooled(
        self,
        operation: str,
        query: Statement,
        params: Mapping[str, object],
        fetch: bool,
        idem_key: str | None,
        effect_id: str | None,
    ) -> tuple[Any, ...] | bool | None:
        """``_statement`` of one query on a pool connection (no ``tx``): the row it
        returns (``fetch``), or whether it changed exactly one row.

        The same steps as ``_statement`` with ``_connection(None)``, written out:
        every step of every call comes through here, and the generic path's
        context managers and closures cost a fresh run a measurable share of its
        client CPU. Kept equal to it by the store's tests of lost connections,
        pools without autocommit, and driver errors.
        """
        retry = operation in REPEATABLE_STEPS
        with _DriverErrors(self, operation, idem_key, effect_id):
            for last_try in (not retry, True):
                async with self._pool.connection() as conn:
                    # One statement needs no BEGIN/COMMIT round trips around it.
                    switched = not conn.autocommit
                    if switched:
                        await conn.set_autocommit(True)
                    try:
                        cursor = await conn.execute(query, params)
                        if fetch:
                            row: tuple[Any, ...] | None = await cursor.fetchone()
                            return row
                        changed: bool = cursor.rowcount == 1
                        return changed
                    except psycopg.OperationalError as exc:
                        if not _connection_lost(exc, conn):
                            raise
                        lost = exc
                    finally:
                        if switched:
                            await _restore_transactional(conn)
                # As in _statement: the pool's other idle connections probably died too.
                await self._pool.check()
                if last_try:
                    raise lost
            raise EffectLedgerInvariantError("unreachable: the last try returns or raises")

    async def _statement(
        self,
        operation: str,
        work: Callable[[Connection], Awaitable[_T]],
        tx: object | None,
        *,
        idem_key: str | None = None,
        effect_id: str | None = None,
    ) -> _T:
        """Run one statement of step ``operation``; once more on a fresh connection
        if its connection broke and the step is in ``REPEATABLE_STEPS``.
        After any lost connection the pool checks its idle ones.

        After a server restart or a killed backend, every idle connection in
        the pool is dead, and each would fail one step before the pool drops
        it. Which steps may take a second try, and why the others may not, is
        the table in ``stores.base``. Inside a caller's transaction nothing is
        retried: the failed statement has aborted that transaction.
        """
        retry = operation in REPEATABLE_STEPS and tx is None
        with self._errors(operation, idem_key=idem_key, effect_id=effect_id):
            for last_try in (not retry, True):
                async with self._connection(tx) as conn:
                    try:
                        return await work(conn)
                    except psycopg.OperationalError as exc:
                        if tx is not None or not _connection_lost(exc, conn):
                            raise
                        lost = exc
                # The pool's other idle connections probably died the same way:
                # have it check them all (only now, after a failure), so the
                # second try, or the caller's own retry of a step that may not
                # be repeated blindly (a commit), gets a live one.
                await self._pool.check()
                if last_try:
                    raise lost
            raise EffectLedgerInvariantError("unreachable: the last try returns or raises")


class _Listener:
    """One ``LISTEN agent_ledger`` connection per store, shared by all its waiters.

    Started by the first subscriber; reconnects with backoff after losing the
    connection and then wakes every subscriber, since changes made while it
    was away were not announced (their next poll catches up).
    """

    #: How long the first subscriber waits for LISTEN to be in place before
    #: relying on polling alone.
    READY_TIMEOUT_S: Final = 2.0

    def __init__(self, pool: AsyncConnectionPool[Any], schema: str, dsn: str | None = None) -> None:
        self._pool = pool
        self._schema = schema
        #: Where to listen: ``listen_dsn``, or (None) the pool's own conninfo.
        self._dsn = dsn
        self.subscribers = Subscribers()
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        #: Set once the listener found a pooler on its connection: LISTEN there
        #: would hear nothing (each transaction may get another server
        #: connection), so it stopped, and waiters poll on their backoff.
        self.polling_only = False

    async def ensure_listening(self) -> None:
        if self.polling_only:
            return
        if self._task is not None and not self._task.done():
            return  # running, or reconnecting: polling covers the gap meanwhile
        self._task = asyncio.get_running_loop().create_task(self._run())
        if not self._listening.is_set():
            try:
                async with asyncio.timeout(self.READY_TIMEOUT_S):
                    await self._listening.wait()
            except TimeoutError:
                logger.warning("notification listener not ready; waiters fall back to polling")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._listening.clear()

    async def _run(self) -> None:
        failures = 0  # in a row: the step of the LISTENER_RECONNECT schedule
        prefix = self._schema + ":"
        while True:
            try:
                if self._dsn is None:
                    conninfo, kwargs = await _connection_settings(self._pool)
                else:
                    conninfo, kwargs = self._dsn, {}
                conn = await AsyncConnection.connect(conninfo, **{**kwargs, "autocommit": True})
                async with conn:
                    if await _behind_pooler(conn):
                        self._stop_for_pooler()
                        return
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
                    self._listening.set()
                    failures = 0
                    self.subscribers.wake_all()
                    async for notice in conn.notifies():
                        if notice.payload.startswith(prefix):
                            self.subscribers.wake(notice.payload[len(prefix) :])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._listening.clear()
                self.subscribers.wake_all()  # let waiters poll while we are deaf
                delay_s = LISTENER_RECONNECT.delay(failures)
                failures += 1
                logger.warning(
                    "notification listener lost its connection (%s); reconnecting in %.2f s",
                    exc,
                    delay_s,
                )
                await asyncio.sleep(delay_s)

    def _stop_for_pooler(self) -> None:
        self.polling_only = True
        self._listening.set()  # nobody waits for a LISTEN that will not come
        logger.warning(
            "notification listener for schema %r is behind a connection pooler, where "
            "LISTEN hears nothing; waiters poll instead. Pass listen_dsn= a direct "
            "connection string to be woken at once.",
            self._schema,
        )


class _ReservedConnection:
    """One connection per store, outside the pool, for heartbeats alone.

    Heartbeats must never wait for a pool connection: a handler that holds
    every connection of the application's pool (the same pool the store
    uses) would starve them, and the effect it runs would be taken over
    while alive. One batched statement per tick needs only one connection.

    Opened at the first heartbeat, from the pool's conninfo, kwargs and
    connection class (like the listener's; the pool's ``configure`` callback
    is not run on it), in autocommit. A statement that fails because the
    connection was lost is repeated once on a fresh one (heartbeats are safe
    to repeat, see ``stores.base``); a statement that is interrupted
    (cancelled, timed out) leaves the connection in an unknown state, so it
    is closed and the next heartbeat connects afresh. ``close()`` closes it.
    """

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool
        self._conn: Connection | None = None
        # One statement at a time on the one connection.
        self._lock = asyncio.Lock()

    async def run(self, work: Callable[[Connection], Awaitable[_T]]) -> _T:
        """``work(conn)`` on the reserved connection; once more on a fresh one if it was lost."""
        async with self._lock:
            for last_try in (False, True):
                conn = self._conn
                if conn is None or conn.closed or conn.broken:
                    conn = self._conn = await self._connect()
                try:
                    return await work(conn)
                except psycopg.OperationalError as exc:
                    lost = _connection_lost(exc, conn)
                    await self._discard()
                    if last_try or not lost:
                        raise
                except psycopg.Error:
                    raise  # the server refused the statement; the connection is fine
                except BaseException:
                    # Interrupted mid-statement (CancelledError included, as
                    # psycopg_pool treats it): the connection may still be
                    # busy with it, so it is closed and the next run connects.
                    await self._discard()
                    raise
            raise EffectLedgerInvariantError("unreachable: the last try returns or raises")

    async def close(self) -> None:
        async with self._lock:
            await self._discard()

    async def _connect(self) -> Connection:
        conninfo, kwargs = await _connection_settings(self._pool)
        connection_class = self._pool.connection_class
        conn: Connection = await connection_class.connect(
            conninfo, **{**kwargs, "autocommit": True}
        )
        return conn

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


async def _connection_settings(pool: AsyncConnectionPool[Any]) -> tuple[str, dict[str, Any]]:
    """The pool's conninfo and kwargs, which psycopg_pool also allows as (async) callables."""
    conninfo: Any = pool.conninfo
    kwargs: Any = pool.kwargs
    if callable(conninfo):
        conninfo = conninfo()
        if inspect.isawaitable(conninfo):
            conninfo = await conninfo
    if callable(kwargs):
        kwargs = kwargs()
        if inspect.isawaitable(kwargs):
            kwargs = await kwargs
    return str(conninfo), dict(kwargs or {})
