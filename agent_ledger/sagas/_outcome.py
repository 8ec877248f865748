"""What happened to a saga and each of its steps, read from the store.

A step row names its effects; their statuses are what happened. So an
outcome is always built from what is stored, never from a worker's memory.
Inside a ``ledger.replay()`` block the effects are the recorded ones: the
steps and their undos were answered from the recording, so the replaying
ledger's store has no receipt of them, and the replayed saga ends as the
recorded one did.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from agent_ledger.context import recording
from agent_ledger.effects import Effect, EffectError
from agent_ledger.status import EffectStatus
from agent_ledger.stores.saga_base import SagaRecord, SagaStatus, SagaStep, SagaStore

if TYPE_CHECKING:
    from agent_ledger.tools import ToolLedger


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """One step: its forward effect and, if it was undone, its compensation."""

    step: SagaStep
    #: None: the forward effect never began.
    forward: Effect | None
    #: None: nothing was undone (not needed, not yet, or no compensation tool).
    compensation: Effect | None

    @property
    def position(self) -> int:
        return self.step.position

    @property
    def tool(self) -> str:
        return self.step.tool

    @property
    def forward_status(self) -> EffectStatus | None:
        return None if self.forward is None else self.forward.status

    @property
    def compensation_status(self) -> EffectStatus | None:
        return None if self.compensation is None else self.compensation.status


@dataclass(frozen=True, slots=True)
class SagaOutcome:
    saga_id: str
    status: SagaStatus
    error: EffectError | None
    steps: tuple[StepOutcome, ...]
    created_at: datetime
    completed_at: datetime | None
    owner: str | None
    attempt: int

    @property
    def parked(self) -> tuple[str, ...]:
        """What the saga waits for a person on: each parked effect of its steps (an
        ambiguous attempt of an ``on_stale="park"`` tool), as ``"step N tool
        (forward|undo)"``. The saga stays running (or compensating) meanwhile
        and goes on once the effect is settled (``resolve``, ``approve``, ``deny``)."""
        waiting = []
        for s in self.steps:
            if s.forward is not None and s.forward.parked:
                waiting.append(f"step {s.position} {s.tool} (forward)")
            if s.compensation is not None and s.compensation.parked:
                waiting.append(f"step {s.position} {s.step.compensation} (undo)")
        return tuple(waiting)

    @property
    def failed_compensations(self) -> tuple[StepOutcome, ...]:
        """Steps whose compensation ended failed (or never got an effect: no such tool)."""
        return tuple(s for s in self.steps if _compensation_failed(s))

    @property
    def compensated(self) -> tuple[StepOutcome, ...]:
        """Steps undone, in the order they are undone: groups last to first."""
        done = [s for s in self.steps if s.compensation_status is EffectStatus.SUCCEEDED]
        return tuple(sorted(done, key=lambda s: (-s.step.group_index, s.position)))


async def _effect(ledger: ToolLedger, idem_key: str) -> Effect | None:
    """The effect under ``idem_key``: the recorded one in a replay of this ledger
    (if the recording has it finished), else the ledger's own."""
    answering = recording()
    if answering is not None and answering.ledger is ledger:
        recorded = await answering.recorded(idem_key)
        if recorded is not None:
            return recorded
    return await ledger.find_by_idem_key(idem_key)


def _compensation_failed(step: StepOutcome) -> bool:
    return step.compensation_status in (EffectStatus.FAILED, EffectStatus.CANCELED)


async def read_outcome(ledger: ToolLedger, store: SagaStore, saga: SagaRecord) -> SagaOutcome:
    """The saga as stored now, with each step's effects."""
    steps = await store.saga_steps(saga.saga_id)
    outcomes = []
    for step in steps:
        forward = await _effect(ledger, step.idem_key)
        compensation = (
            None if step.compensation_key is None else await _effect(ledger, step.compensation_key)
        )
        outcomes.append(StepOutcome(step, forward, compensation))
    return SagaOutcome(
        saga_id=saga.saga_id,
        status=saga.status,
        error=saga.error,
        steps=tuple(outcomes),
        created_at=saga.created_at,
        completed_at=saga.completed_at,
        owner=saga.owner,
        attempt=saga.attempt,
    )
