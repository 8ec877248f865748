"""MySQLStore's saga steps (``SagaStore``), kept apart from its effect steps.

Each step is one statement in autocommit, except those that must read what
they wrote (begin_saga, claim_saga) or check ownership before writing
(record_step): those run as one transaction, whose row locks keep the check
and the write one step. Statements are in ``_mysql_queries``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from agent_ledger.effects import EffectError
from agent_ledger.stores import _mysql_queries as q
from agent_ledger.stores._mysql_tables import Cursor, MySQLTables, insert_new, stored, utc
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

_OPEN: Final = tuple(sorted(s.value for s in SAGA_OPEN))


def _saga(row: tuple[Any, ...]) -> SagaRecord:
    return saga_from_row(row, utc)


def _step(row: tuple[Any, ...]) -> SagaStep:
    return step_from_row(row, utc)


class MySQLSagas(MySQLTables):
    """Mixed into ``MySQLStore``: the saga tables."""

    async def begin_saga(self, new: NewSaga) -> SagaBegin:
        params: dict[str, object] = {**new._asdict(), "status": SagaStatus.RUNNING.value}

        async def work(cur: Cursor) -> SagaBegin:
            created = await insert_new(cur, q.SAGA_INSERT, params)
            await cur.execute(q.SAGA_GET, params)
            return SagaBegin(_saga(await cur.fetchone()), created)

        return await self._run("begin_saga", work, None, atomic=True)

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

        async def work(cur: Cursor) -> SagaRecord | None:
            if await cur.execute(q.SAGA_CLAIM, params) != 1:
                return None
            await cur.execute(q.SAGA_GET, params)
            return _saga(await cur.fetchone())

        return await self._run("claim_saga", work, None, atomic=True)

    async def heartbeat_saga(self, saga_id: str, *, attempt: int) -> bool:
        params: dict[str, object] = {"saga_id": saga_id, "attempt": attempt, "open": _OPEN}

        async def work(cur: Cursor) -> bool:
            return bool(await cur.execute(q.SAGA_HEARTBEAT, params) == 1)

        return await self._run("heartbeat_saga", work, None, atomic=False)

    async def release_saga(self, saga_id: str, *, attempt: int) -> bool:
        params = release_saga_params(saga_id, attempt)

        async def work(cur: Cursor) -> bool:
            return bool(await cur.execute(q.SAGA_RELEASE, params) == 1)

        return await self._run("release_saga", work, None, atomic=False)

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
        params = finish_saga_params(saga_id, attempt, expect, then) | saga_error_columns(error)

        async def work(cur: Cursor) -> bool:
            return bool(await cur.execute(q.SAGA_FINISH, params) == 1)

        return await self._run("finish_saga", work, None, atomic=False)

    async def record_step(
        self, saga_id: str, *, attempt: int, step: NewSagaStep
    ) -> SagaStep | None:
        owner = {"saga_id": saga_id, "attempt": attempt, "running": SagaStatus.RUNNING.value}
        params: dict[str, object] = {**step._asdict(), "saga_id": saga_id}

        async def work(cur: Cursor) -> SagaStep | None:
            await cur.execute(q.SAGA_OWNS_RUNNING, owner)
            if await cur.fetchone() is None:
                return None
            await insert_new(cur, q.STEP_INSERT, params)
            await cur.execute(q.STEP_GET, params)
            return _step(await cur.fetchone())

        return await self._run("record_step", work, None, atomic=True)

    async def get_saga(self, saga_id: str) -> SagaRecord | None:
        return await self._read_one("get_saga", q.SAGA_GET, {"saga_id": saga_id}, _saga)

    async def saga_steps(self, saga_id: str) -> list[SagaStep]:
        async def work(cur: Cursor) -> list[SagaStep]:
            await cur.execute(q.SAGA_STEPS, {"saga_id": saga_id})
            return [_step(row) for row in await cur.fetchall()]

        return await self._run("saga_steps", work, None, atomic=False)

    async def list_sagas(
        self, *, statuses: frozenset[SagaStatus] | None = None, limit: int = 100
    ) -> list[SagaRecord]:
        check_saga_limit(limit)
        if statuses is not None and not statuses:
            return []  # IN () is not SQL; no status matches nothing
        params: dict[str, object] = {"limit": limit}
        statement = q.SAGA_LIST_ALL
        if statuses is not None:
            params["statuses"] = tuple(sorted(s.value for s in statuses))
            statement = q.SAGA_LIST

        async def work(cur: Cursor) -> list[SagaRecord]:
            await cur.execute(statement, params)
            return [_saga(row) for row in await cur.fetchall()]

        return await self._run("list_sagas", work, None, atomic=False)

    async def claimable_sagas(
        self, *, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> list[SagaRecord]:
        check_saga_limit(limit)
        params: dict[str, object] = {
            "after_at": None if after is None else stored(after[0]),
            "after_id": None if after is None else after[1],
            "limit": limit,
        }

        async def work(cur: Cursor) -> list[SagaRecord]:
            await cur.execute(q.SAGA_CLAIMABLE, params)
            return [_saga(row) for row in await cur.fetchall()]

        return await self._run("claimable_sagas", work, None, atomic=False)
