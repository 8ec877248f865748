"""PostgresStore's saga steps (``SagaStore``), kept apart from its effect steps.

Each step is one statement in autocommit (``_postgres_queries``); none is
repeated after a lost reply (they are not in ``REPEATABLE_STEPS``): the
caller sees the error, as for a commit.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, LiteralString

from psycopg import sql

from agent_ledger.effects import EffectError
from agent_ledger.stores import _postgres_queries as q
from agent_ledger.stores._postgres_tables import Connection, PostgresTables, utc
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
    saga_error_json,
    saga_from_row,
    step_from_row,
)

SAGAS_TABLE: Final = "agent_ledger_sagas"
STEPS_TABLE: Final = "agent_ledger_saga_steps"
_OPEN: Final = sorted(s.value for s in SAGA_OPEN)


def _saga(row: tuple[Any, ...]) -> SagaRecord:
    return saga_from_row(row, utc)


def _step(row: tuple[Any, ...]) -> SagaStep:
    return step_from_row(row, utc)


class PostgresSagas(PostgresTables):
    """Mixed into ``PostgresStore``: the saga tables of schema version 3."""

    @functools.cached_property
    def _saga_sql(self) -> dict[str, sql.Composed]:
        tables = {"sagas": SAGAS_TABLE, "steps": STEPS_TABLE}
        texts: dict[str, LiteralString] = {
            "begin": q.SAGA_BEGIN,
            "get": q.SAGA_GET,
            "claim": q.SAGA_CLAIM,
            "heartbeat": q.SAGA_HEARTBEAT,
            "release": q.SAGA_RELEASE,
            "finish": q.SAGA_FINISH,
            "record": q.STEP_RECORD,
            "steps": q.SAGA_STEPS,
            "list": q.SAGA_LIST,
            "claimable": q.SAGA_CLAIMABLE,
        }
        return self._composed(tables, texts)

    async def _saga_rows(
        self, operation: str, name: str, params: Mapping[str, object] | tuple[object, ...]
    ) -> list[tuple[Any, ...]]:
        statement = self._saga_sql[name]

        async def fetch(conn: Connection) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(statement, params)
            return await cursor.fetchall() if cursor.description is not None else []

        return await self._statement(operation, fetch, None)

    async def _saga_count(self, operation: str, name: str, params: Mapping[str, object]) -> int:
        statement = self._saga_sql[name]

        async def execute(conn: Connection) -> int:
            cursor = await conn.execute(statement, params)
            return cursor.rowcount

        return await self._statement(operation, execute, None)

    async def begin_saga(self, new: NewSaga) -> SagaBegin:
        params = {**new._asdict(), "status": SagaStatus.RUNNING.value}
        [row] = await self._saga_rows("begin_saga", "begin", params)
        return SagaBegin(_saga(row[:-1]), bool(row[-1]))

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
        params = claim_saga_params(saga_id, expect, then, lease_ms, idle_ms, owner)
        rows = await self._saga_rows("claim_saga", "claim", params)
        return _saga(rows[0]) if rows else None

    async def heartbeat_saga(self, saga_id: str, *, attempt: int) -> bool:
        params = {"saga_id": saga_id, "attempt": attempt, "open": _OPEN}
        return await self._saga_count("heartbeat_saga", "heartbeat", params) == 1

    async def release_saga(self, saga_id: str, *, attempt: int) -> bool:
        params = release_saga_params(saga_id, attempt)
        return await self._saga_count("release_saga", "release", params) == 1

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
        params = finish_saga_params(saga_id, attempt, expect, then)
        params["error"] = saga_error_json(error)
        return await self._saga_count("finish_saga", "finish", params) == 1

    async def record_step(
        self, saga_id: str, *, attempt: int, step: NewSagaStep
    ) -> SagaStep | None:
        params = {
            **step._asdict(),
            "saga_id": saga_id,
            "attempt": attempt,
            "running": SagaStatus.RUNNING.value,
        }
        rows = await self._saga_rows("record_step", "record", params)
        return _step(rows[0]) if rows else None

    async def get_saga(self, saga_id: str) -> SagaRecord | None:
        rows = await self._saga_rows("get_saga", "get", (saga_id,))
        return _saga(rows[0]) if rows else None

    async def saga_steps(self, saga_id: str) -> list[SagaStep]:
        return [_step(row) for row in await self._saga_rows("saga_steps", "steps", (saga_id,))]

    async def list_sagas(
        self, *, statuses: frozenset[SagaStatus] | None = None, limit: int = 100
    ) -> list[SagaRecord]:
        check_saga_limit(limit)
        wanted = None if statuses is None else sorted(s.value for s in statuses)
        rows = await self._saga_rows("list_sagas", "list", {"statuses": wanted, "limit": limit})
        return [_saga(row) for row in rows]

    async def claimable_sagas(
        self, *, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> list[SagaRecord]:
        check_saga_limit(limit)
        params = {
            "after_at": None if after is None else after[0],
            "after_id": None if after is None else after[1],
            "limit": limit,
        }
        rows = await self._saga_rows("claimable_sagas", "claimable", params)
        return [_saga(row) for row in rows]
