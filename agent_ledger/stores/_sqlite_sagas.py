"""SqliteStore's saga steps (``SagaStore``), kept apart from its effect steps.

Every writing step runs in its own ``BEGIN IMMEDIATE`` transaction, like the
effect steps, so its check and its write see no other writer in between, in
this process or another. Statements are in ``_sqlite_queries``.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any, Final

import orjson

from agent_ledger.effects import EffectError
from agent_ledger.stores import _sqlite_queries as q
from agent_ledger.stores._sqlite_tables import SqliteTables, from_us, to_us
from agent_ledger.stores.saga_base import (
    SAGA_OPEN,
    NewSaga,
    NewSagaStep,
    SagaBegin,
    SagaRecord,
    SagaStatus,
    SagaStep,
    check_saga_limit,
    check_saga_move,
    claim_saga_params,
    finish_saga_params,
    release_saga_params,
    saga_error_columns,
    saga_from_row,
    step_from_row,
)

_OPEN: Final = orjson.dumps(sorted(s.value for s in SAGA_OPEN)).decode()


def _saga(row: tuple[Any, ...]) -> SagaRecord:
    return saga_from_row(row, from_us)


def _step(row: tuple[Any, ...]) -> SagaStep:
    return step_from_row(row, from_us)


class SqliteSagas(SqliteTables):
    """Mixed into ``SqliteStore``: the saga tables of schema version 3."""

    async def begin_saga(self, new: NewSaga) -> SagaBegin:
        await self._enter(None)
        params = {**new._asdict(), "status": SagaStatus.RUNNING.value}

        def work(conn: sqlite3.Connection, now: int) -> SagaBegin:
            created = conn.execute(q.SAGA_INSERT, params | {"now": now}).rowcount == 1
            row = conn.execute(q.SAGA_GET, (new.saga_id,)).fetchone()
            return SagaBegin(_saga(row), created)

        return await self._run("begin_saga", work, None, write=True)

    async def claim_saga(
        self,
        saga_id: str,
        *,
        expect: SagaStatus,
        then: SagaStatus,
        lease_ms: int,
        idle_ms: int,
        owner: str | None,
    ) -> SagaRecord | None:
        await self._enter(None)
        params = claim_saga_params(saga_id, expect, then, lease_ms, idle_ms, owner)

        def work(conn: sqlite3.Connection, now: int) -> SagaRecord | None:
            if conn.execute(q.SAGA_CLAIM, params | {"now": now}).rowcount != 1:
                return None
            return _saga(conn.execute(q.SAGA_GET, (saga_id,)).fetchone())

        return await self._run("claim_saga", work, None, write=True)

    async def heartbeat_saga(self, saga_id: str, *, attempt: int) -> bool:
        await self._enter(None)
        params = {"saga_id": saga_id, "attempt": attempt, "open": _OPEN}

        def work(conn: sqlite3.Connection, now: int) -> bool:
            return conn.execute(q.SAGA_HEARTBEAT, params | {"now": now}).rowcount == 1

        return await self._run("heartbeat_saga", work, None, write=True)

    async def release_saga(self, saga_id: str, *, attempt: int) -> bool:
        await self._enter(None)
        params = release_saga_params(saga_id, attempt)

        def work(conn: sqlite3.Connection, now: int) -> bool:
            return conn.execute(q.SAGA_RELEASE, params).rowcount == 1

        return await self._run("release_saga", work, None, write=True)

    async def finish_saga(
        self,
        saga_id: str,
        *,
        attempt: int,
        expect: SagaStatus,
        then: SagaStatus,
        error: EffectError | None,
    ) -> bool:
        check_saga_move(expect, then)
        await self._enter(None)
        params = finish_saga_params(saga_id, attempt, expect, then) | saga_error_columns(error)

        def work(conn: sqlite3.Connection, now: int) -> bool:
            return conn.execute(q.SAGA_FINISH, params | {"now": now}).rowcount == 1

        return await self._run("finish_saga", work, None, write=True)

    async def record_step(
        self, saga_id: str, *, attempt: int, step: NewSagaStep
    ) -> SagaStep | None:
        await self._enter(None)
        owner = {"saga_id": saga_id, "attempt": attempt, "running": SagaStatus.RUNNING.value}
        params = {**step._asdict(), "saga_id": saga_id}

        def work(conn: sqlite3.Connection, now: int) -> SagaStep | None:
            if conn.execute(q.SAGA_OWNS_RUNNING, owner).fetchone() is None:
                return None
            conn.execute(q.STEP_INSERT, params | {"now": now})
            row = conn.execute(q.STEP_GET, {"saga_id": saga_id, "position": step.position})
            return _step(row.fetchone())

        return await self._run("record_step", work, None, write=True)

    async def get_saga(self, saga_id: str) -> SagaRecord | None:
        return await self._read_one("get_saga", q.SAGA_GET, (saga_id,), _saga)

    async def saga_steps(self, saga_id: str) -> list[SagaStep]:
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> list[SagaStep]:
            return [_step(row) for row in conn.execute(q.SAGA_STEPS, (saga_id,))]

        return await self._run("saga_steps", work, None, write=False)

    async def list_sagas(
        self, *, statuses: frozenset[SagaStatus] | None = None, limit: int = 100
    ) -> list[SagaRecord]:
        check_saga_limit(limit)
        await self._enter(None)
        wanted = None if statuses is None else orjson.dumps(sorted(statuses)).decode()
        params = {"statuses": wanted, "limit": limit}

        def work(conn: sqlite3.Connection, now: int) -> list[SagaRecord]:
            return [_saga(row) for row in conn.execute(q.SAGA_LIST, params)]

        return await self._run("list_sagas", work, None, write=False)

    async def claimable_sagas(
        self, *, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> list[SagaRecord]:
        check_saga_limit(limit)
        await self._enter(None)
        params: dict[str, object] = {
            "after_us": None if after is None else to_us(after[0]),
            "after_id": None if after is None else after[1],
            "limit": limit,
        }

        def work(conn: sqlite3.Connection, now: int) -> list[SagaRecord]:
            return [_saga(row) for row in conn.execute(q.SAGA_CLAIMABLE, params | {"now": now})]

        return await self._run("claimable_sagas", work, None, write=False)
