"""MemoryStore's saga steps (``SagaStore``): the in-process twin of the saga tables.

Each step is a synchronous update inside one event loop, so it is atomic
without a lock, as MemoryStore's effect steps are. Like them, it first waits
out another task's open transaction (the store's gate): sagas are not part of
a transaction, and from inside a block a saga step is refused, as on SQLite,
rather than waiting for that block to end.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent_ledger.effects import EffectError
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
)

if TYPE_CHECKING:
    from agent_ledger.clock import Clock
    from agent_ledger.stores._transactions import TransactionGate


class MemorySagas:
    """Mixed into ``MemoryStore``: sagas and their steps, kept until the process exits."""

    if TYPE_CHECKING:
        _clock: Clock
        _gate: TransactionGate[Any]

    async def _saga_turn(self) -> None:
        """Wait out another task's open transaction; refused from inside its block."""
        if self._gate.active is not None:
            await self._gate.enter(None)

    def _init_sagas(self) -> None:
        self._saga_rows: dict[str, SagaRecord] = {}
        self._step_rows: dict[str, dict[int, SagaStep]] = {}

    async def begin_saga(self, new: NewSaga) -> SagaBegin:
        await self._saga_turn()
        found = self._saga_rows.get(new.saga_id)
        if found is not None:
            return SagaBegin(found, False)
        now = self._clock()
        saga = SagaRecord(
            saga_id=new.saga_id,
            status=SagaStatus.RUNNING,
            attempt=1,
            owner=new.owner,
            lease_ms=new.lease_ms,
            heartbeat_at=now,
            abandon_after_ms=new.abandon_after_ms,
            on_compensation_failure=new.on_compensation_failure,
            error=None,
            created_at=now,
            updated_at=now,
            completed_at=None,
        )
        self._saga_rows[new.saga_id] = saga
        self._step_rows[new.saga_id] = {}
        return SagaBegin(saga, True)

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
        await self._saga_turn()
        saga = self._saga_rows.get(saga_id)
        now = self._clock()
        if saga is None or saga.status is not expect or saga.lease_ms <= 0:
            return None
        if saga.heartbeat_at > now - timedelta(milliseconds=max(saga.lease_ms, idle_ms)):
            return None
        claimed = dataclasses.replace(
            saga,
            status=then,
            attempt=saga.attempt + 1,
            owner=owner,
            lease_ms=lease_ms,
            heartbeat_at=now,
            updated_at=now,
        )
        self._saga_rows[saga_id] = claimed
        return claimed

    async def heartbeat_saga(self, saga_id: str, *, attempt: int) -> bool:
        await self._saga_turn()
        saga = self._saga_rows.get(saga_id)
        if saga is None or saga.attempt != attempt or saga.status not in SAGA_OPEN:
            return False
        self._saga_rows[saga_id] = dataclasses.replace(saga, heartbeat_at=self._clock())
        return True

    async def release_saga(self, saga_id: str, *, attempt: int) -> bool:
        await self._saga_turn()
        saga = self._saga_rows.get(saga_id)
        if saga is None or saga.attempt != attempt or saga.status is not SagaStatus.COMPENSATING:
            return False
        self._saga_rows[saga_id] = dataclasses.replace(
            saga, heartbeat_at=datetime(1970, 1, 1, tzinfo=UTC)
        )
        return True

    async def finish_saga(
        self,
        saga_id: str,
        *,
        attempt: int,
        expect: SagaStatus,
        then: SagaStatus,
        error: EffectError | None,
    ) -> bool:
        await self._saga_turn()
        check_saga_move(expect, then)
        saga = self._saga_rows.get(saga_id)
        if saga is None or saga.attempt != attempt or saga.status is not expect:
            return False
        now: datetime = self._clock()
        self._saga_rows[saga_id] = dataclasses.replace(
            saga,
            status=then,
            heartbeat_at=now,
            updated_at=now,
            error=saga.error if error is None else error,
            completed_at=now if then.is_terminal else None,
        )
        return True

    async def record_step(
        self, saga_id: str, *, attempt: int, step: NewSagaStep
    ) -> SagaStep | None:
        await self._saga_turn()
        saga = self._saga_rows.get(saga_id)
        if saga is None or saga.attempt != attempt or saga.status is not SagaStatus.RUNNING:
            return None
        steps = self._step_rows[saga_id]
        if step.position not in steps:
            steps[step.position] = SagaStep(saga_id, *step, created_at=self._clock())
        return steps[step.position]

    async def get_saga(self, saga_id: str) -> SagaRecord | None:
        await self._saga_turn()
        return self._saga_rows.get(saga_id)

    async def saga_steps(self, saga_id: str) -> list[SagaStep]:
        await self._saga_turn()
        steps = self._step_rows.get(saga_id, {})
        return [steps[p] for p in sorted(steps)]

    async def list_sagas(
        self, *, statuses: frozenset[SagaStatus] | None = None, limit: int = 100
    ) -> list[SagaRecord]:
        await self._saga_turn()
        check_saga_limit(limit)
        rows = [s for s in self._saga_rows.values() if statuses is None or s.status in statuses]
        rows.sort(key=lambda s: (s.created_at, s.saga_id), reverse=True)
        return rows[:limit]

    async def claimable_sagas(
        self, *, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> list[SagaRecord]:
        await self._saga_turn()
        check_saga_limit(limit)
        now: datetime = self._clock()
        rows = [
            s
            for s in self._saga_rows.values()
            if _claimable(s, now) and (after is None or (s.created_at, s.saga_id) > after)
        ]
        rows.sort(key=lambda s: (s.created_at, s.saga_id))
        return rows[:limit]


def _claimable(saga: SagaRecord, now: datetime) -> bool:
    """What ``claim_saga`` from a recoverer would take now (see ``claimable_sagas``)."""
    if saga.lease_ms <= 0:
        return False
    if saga.status is SagaStatus.COMPENSATING:
        idle_ms = saga.lease_ms
    elif saga.status is SagaStatus.RUNNING and saga.abandon_after_ms is not None:
        idle_ms = max(saga.lease_ms, saga.abandon_after_ms)
    else:
        return False
    return saga.heartbeat_at <= now - timedelta(milliseconds=idle_ms)
