"""Sagas: undo completed steps in reverse order when a later one fails.

Built on effects (the layer above tools): every forward step and every
compensation is an ordinary effect, idempotent and fenced, and the saga's
own state lives in the store (``SagaStore``), never only in memory. See
``docs/sagas.md``.
"""

from __future__ import annotations

from agent_ledger.sagas._compensation import COMPENSATION_RETRY
from agent_ledger.sagas._errors import (
    SagaCompensationFailed,
    SagaError,
    SagaFailed,
    SagaInFlightError,
    SagaNondeterminismError,
    SagaOwnershipLostError,
    SagaStepCancelled,
    SagaStepParked,
    SagaStepUnsettled,
)
from agent_ledger.sagas._outcome import SagaOutcome, StepOutcome
from agent_ledger.sagas._plan import check_plan, run_saga
from agent_ledger.sagas._recovery import SagaRecovery, recover_sagas
from agent_ledger.sagas._saga import Saga
from agent_ledger.sagas._settings import check_step_settings
from agent_ledger.stores.saga_base import SagaStatus

__all__ = [
    "COMPENSATION_RETRY",
    "Saga",
    "SagaCompensationFailed",
    "SagaError",
    "SagaFailed",
    "SagaInFlightError",
    "SagaNondeterminismError",
    "SagaOutcome",
    "SagaOwnershipLostError",
    "SagaRecovery",
    "SagaStatus",
    "SagaStepCancelled",
    "SagaStepParked",
    "SagaStepUnsettled",
    "StepOutcome",
    "check_plan",
    "check_step_settings",
    "recover_sagas",
    "run_saga",
]
