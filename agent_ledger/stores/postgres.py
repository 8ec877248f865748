"""PostgreSQL store: the ledger's guarantees across processes, machines and restarts.

Every ledger step is one SQL statement and one round trip, in autocommit
unless the caller passes a transaction (``_postgres_queries`` has them all).
Timestamps and staleness use the database clock. Waiters are woken by
``LISTEN/NOTIFY`` through one listening connection per store, with the
ledger's polling as the fallback, so a lost notification only costs latency.

Needs ``pip install "agent-ledger[postgres]"`` and PostgreSQL 14 or later.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, Final, LiteralString, TypeVar

import orjson
import psycopg
from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

from agent_ledger.backoff import LISTENER_RECONNECT
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import (
    EffectLedgerError,
    EffectLedgerInvariantError,
    EffectLedgerValidationError,
    EffectStoreError,
)
from agent_ledger.ids import is_effect_id
from agent_ledger.observability import logger
from agent_ledger.status import EffectStatus
from agent_ledger.stores import _postgres_queries as q
from agent_ledger.stores._params import (
    Dialect,
    begin_params,
    claim_params,
    commit_params,
    list_params,
    release_params,
    transition_params,
)
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
    LedgerStats,
    NewEffect,
    check_commit_status,
    check_purge_statuses,
    check_transition_target,
)

__all__ = ["SCHEMA_SQL", "SCHEMA_VERSION", "PostgresStore"]

#: The schema this version of the library needs (see the marker table).
SCHEMA_VERSION: Final = 2
#: The text of ``schema.sql``; apply it with ``conn.execute(SCHEMA_SQL)``.
# Typed LiteralString so `conn.execute(SCHEMA_SQL)` type-checks: it is our own file.
SCHEMA_SQL: Final[LiteralString] = (
    resources.files("agent_ledger.stores").joinpath("postgres_schema.sql").read_text("utf-8")
)
EFFECTS_TABLE: Final = "agent_ledger_effects"
VERSIONS_TABLE: Final = "agent_ledger_schema_version"
NOTIFY_CHANNEL: Final = "agent_ledger"

_PROCESSING: Final = EffectStatus.PROCESSING.value
_STATUS_BY_VALUE: Final = STATUS_BY_VALUE

_T = TypeVar("_T")

#: Columns of EFFECT_COLUMNS; a query may add one more (begin's and claim's flag).
_EFFECT_WIDTH: Final = EFFECT_WIDTH

# Connection used by an operation: the caller's transaction, or the pool's.
Connection = AsyncConnection[Any]


def _effect_from_row(row: tuple[Any, ...]) -> Effect:
    return effect_from_row(row, _utc)


def _utc(moment: datetime) -> datetime:
    # psycopg returns timestamptz in the session's TimeZone; receipts are UTC.
    return moment if moment.tzinfo is UTC else moment.astimezone(UTC)


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


class PostgresStore:
    """Effects in PostgreSQL, shared by every worker that uses the same database.

    ``pool`` is the caller's ``psycopg_pool.AsyncConnectionPool`` (opened by
    the caller, and closed by the caller unless the store was made with
    :meth:`connect`). Pool connections are switched to autocommit for the
    duration of each step, so every step is exactly one statement; create
    the pool with ``kwargs={"autocommit": True}`` to skip even that.
    ``schema`` is where the tables live (validated; only ever quoted as an
    identifier).
    """

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, schema: str = "public", _owns_pool: bool = False
    ) -> None:
        if not isinstance(schema, str) or not schema or len(schema.encode()) > 63:
            raise EffectLedgerValidationError(
                f"schema must be a PostgreSQL identifier of 1 to 63 bytes, got {schema!r}",
                field="schema",
            )
        self._pool = pool
        self._owns_pool = _owns_pool
        self.schema = schema
        effects = sql.Identifier(schema, EFFECTS_TABLE)
        versions = sql.Identifier(schema, VERSIONS_TABLE)

        def compose(text: LiteralString) -> sql.Composed:
            return sql.SQL(text).format(effects=effects, versions=versions)

        self._begin = compose(q.BEGIN)
        self._claim = compose(q.CLAIM)
        self._heartbeat = compose(q.HEARTBEAT)
        self._commit = compose(q.COMMIT)
        self._release = compose(q.RELEASE)
        self._transition = compose(q.TRANSITION)
        self._get = compose(q.GET)
        self._find = compose(q.FIND)
        self._schema_version = compose(q.SCHEMA_VERSION)
        self._stats = compose(q.STATS)
        self._purge = compose(q.PURGE)
        self._effects = effects
        self._listener = _Listener(pool, schema)

    @classmethod
    async def connect(
        cls,
        conninfo: str,
        *,
        schema: str = "public",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 30.0,
    ) -> PostgresStore:
        """Open a pool of autocommit connections that the store owns and closes.

        Raises ``EffectStoreError`` if ``min_size`` connections cannot be made
        within ``connect_timeout`` seconds.
        """
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            conninfo, min_size=min_size, max_size=max_size, kwargs={"autocommit": True}, open=False
        )
        try:
            await pool.open(wait=True, timeout=connect_timeout)
        except Exception as exc:
            await pool.close()
            raise EffectStoreError(f"{type(exc).__name__}: {exc}", operation="connect") from exc
        return cls(pool, schema=schema, _owns_pool=True)

    # -- schema ----------------------------------------------------------------

    async def create_schema(self) -> None:
        """Create the schema (if needed) and apply ``SCHEMA_SQL`` inside it; idempotent."""
        with self._errors("create_schema"):
            async with self._pool.connection() as conn, conn.transaction():
                # Several workers may run this at start-up, and even the IF NOT
                # EXISTS forms race on the catalog: take turns, first thing.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agent_ledger_schema'))")
                await conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
                )
                await conn.execute(
                    sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(self.schema))
                )
                await conn.execute(SCHEMA_SQL)

    async def check_schema(self) -> int:
        """The schema version in the database; raises with a fix if it is missing or old."""
        with self._errors("check_schema"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(self._schema_version)
                row = await cursor.fetchone()
        version = row[0] if row is not None else None
        if version is None or version < SCHEMA_VERSION:
            raise EffectStoreError(
                f"schema {self.schema!r} is at version {version}, this library needs "
                f"{SCHEMA_VERSION}: apply schema.sql (or await store.create_schema())",
                operation="check_schema",
            )
        return int(version)

    # -- ledger steps -----------------------------------------------------------

    async def begin(self, new: NewEffect, *, tx: object | None = None) -> BeginOutcome:
        params = begin_params(new)
        row = await self._fetch_one("begin", self._begin, params, tx, idem_key=new.idem_key)
        if row is None:
            raise EffectStoreError("INSERT ... RETURNING gave no row", operation="begin")
        return BeginOutcome(_effect_from_row(row), created=bool(row[_EFFECT_WIDTH]))

    async def claim(
        self,
        idem_key: str,
        *,
        stale_after_ms: int,
        lease_ms: int | None = None,
        tx: object | None = None,
    ) -> ClaimOutcome:
        params = claim_params(_DIALECT, idem_key, stale_after_ms=stale_after_ms, lease_ms=lease_ms)
        row = await self._fetch_one("claim", self._claim, params, tx, idem_key=idem_key)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        return ClaimOutcome(_effect_from_row(row), claimed=bool(row[_EFFECT_WIDTH]))

    async def heartbeat(self, effect_id: str, attempt: int) -> bool:
        if not is_effect_id(effect_id):
            return False
        params = {"id": effect_id, "attempt": attempt, "processing": _PROCESSING}
        return await self._execute("heartbeat", self._heartbeat, params, None, effect_id=effect_id)

    async def commit(
        self,
        effect_id: str,
        *,
        attempt: int | None,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None = None,
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
        )
        return await self._execute("commit", self._commit, params, tx, effect_id=effect_id)

    async def release(self, effect_id: str, *, attempt: int) -> bool:
        if not is_effect_id(effect_id):
            return False
        params = release_params(effect_id, attempt=attempt)
        return await self._execute("release", self._release, params, None, effect_id=effect_id)

    async def transition(
        self,
        idem_key: str,
        *,
        target: EffectStatus,
        error: EffectError | None = None,
        decision: Decision | None = None,
        tx: object | None = None,
    ) -> Effect | None:
        check_transition_target(target)
        params = transition_params(
            _DIALECT, idem_key, target=target, error=error, decision=decision
        )
        row = await self._fetch_one("transition", self._transition, params, tx, idem_key=idem_key)
        return None if row is None else _effect_from_row(row)

    async def get(self, effect_id: str, *, tx: object | None = None) -> Effect | None:
        if not is_effect_id(effect_id):
            return None
        row = await self._fetch_one("get", self._get, {"id": effect_id}, tx, effect_id=effect_id)
        return None if row is None else _effect_from_row(row)

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        params = {"idem_key": idem_key}
        row = await self._fetch_one("find", self._find, params, tx, idem_key=idem_key)
        return None if row is None else _effect_from_row(row)

    # -- audit --------------------------------------------------------------------

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        if query.before is not None and not is_effect_id(query.before[1]):
            raise EffectLedgerValidationError("cursor names no effect", field="cursor")
        names, params = list_params(_DIALECT, query)
        filters = [q.LIST_FILTERS[name] for name in names]
        statement = sql.SQL(q.LIST).format(effects=self._effects)
        if filters:
            where = sql.SQL(" AND ").join(sql.SQL(f) for f in filters)
            statement = statement + sql.SQL(" WHERE ") + where
        statement = statement + sql.SQL(q.LIST_ORDER)
        with self._errors("list_effects"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(statement, params)
                return [_effect_from_row(row) for row in await cursor.fetchall()]

    async def stats(self) -> LedgerStats:
        with self._errors("stats"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(self._stats)
                rows = await cursor.fetchall()
        return stats_from_groups((_STATUS_BY_VALUE[st], tool, n, d) for st, tool, n, d in rows)

    async def purge(self, *, older_than: timedelta, statuses: frozenset[EffectStatus]) -> int:
        check_purge_statuses(statuses)
        params = {
            "statuses": _DIALECT.statuses(statuses),
            "older_ms": older_than / timedelta(milliseconds=1),
        }
        with self._errors("purge"):
            async with self._connection(None) as conn:
                cursor = await conn.execute(self._purge, params)
                return cursor.rowcount

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
        """Stop the notification listener; close the pool if the store opened it."""
        await self._listener.stop()
        if self._owns_pool:
            await self._pool.close()

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
                await conn.set_autocommit(False)

    @contextmanager
    def _errors(
        self, operation: str, *, idem_key: str | None = None, effect_id: str | None = None
    ) -> Iterator[None]:
        """The one place driver errors become ``EffectStoreError``."""
        try:
            yield
        except EffectLedgerError:
            raise  # ours already: never double-wrap
        except psycopg.errors.UndefinedTable as exc:
            raise EffectStoreError(
                f"the agent-ledger tables are missing from schema {self.schema!r}: apply "
                "schema.sql there (or await store.create_schema())",
                operation=operation,
                idem_key=idem_key,
                effect_id=effect_id,
            ) from exc
        except psycopg.Error as exc:
            raise EffectStoreError(
                f"{type(exc).__name__}: {exc}".strip(),
                operation=operation,
                idem_key=idem_key,
                effect_id=effect_id,
            ) from exc

    async def _fetch_one(
        self,
        operation: str,
        query: sql.Composed,
        params: Mapping[str, object],
        tx: object | None,
        *,
        idem_key: str | None = None,
        effect_id: str | None = None,
    ) -> tuple[Any, ...] | None:
        async def fetch(conn: Connection) -> tuple[Any, ...] | None:
            cursor = await conn.execute(query, params)
            return await cursor.fetchone()

        return await self._statement(operation, fetch, tx, idem_key=idem_key, effect_id=effect_id)

    async def _execute(
        self,
        operation: str,
        query: sql.Composed,
        params: Mapping[str, object],
        tx: object | None,
        *,
        effect_id: str | None = None,
    ) -> bool:
        async def execute(conn: Connection) -> bool:
            cursor = await conn.execute(query, params)
            return cursor.rowcount == 1

        return await self._statement(operation, execute, tx, effect_id=effect_id)

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
                        if last_try or not _connection_lost(exc, conn):
                            raise
                # The pool's other idle connections probably died the same way:
                # have it check them all (only now, after a failure), so the
                # second try gets a live one.
                await self._pool.check()
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

    def __init__(self, pool: AsyncConnectionPool[Any], schema: str) -> None:
        self._pool = pool
        self._schema = schema
        self.subscribers = Subscribers()
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    async def ensure_listening(self) -> None:
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

    async def _connection_settings(self) -> tuple[str, dict[str, Any]]:
        """The pool's conninfo and kwargs, which psycopg_pool also allows as (async) callables."""
        conninfo: Any = self._pool.conninfo
        kwargs: Any = self._pool.kwargs
        if callable(conninfo):
            conninfo = conninfo()
            if inspect.isawaitable(conninfo):
                conninfo = await conninfo
        if callable(kwargs):
            kwargs = kwargs()
            if inspect.isawaitable(kwargs):
                kwargs = await kwargs
        return str(conninfo), dict(kwargs or {})

    async def _run(self) -> None:
        failures = 0  # in a row: the step of the LISTENER_RECONNECT schedule
        prefix = self._schema + ":"
        while True:
            try:
                conninfo, kwargs = await self._connection_settings()
                conn = await AsyncConnection.connect(conninfo, **{**kwargs, "autocommit": True})
                async with conn:
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
