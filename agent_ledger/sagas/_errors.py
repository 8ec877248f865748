"""The errors a saga raises, under ``EffectLedgerError``.

::

    EffectLedgerError
    └── SagaError
        ├── SagaFailed                 a step failed: the saga was rolled back
        │   └── SagaCompensationFailed  ... and at least one undo kept failing
        ├── SagaNondeterminismError    the code asks for another step than the one recorded
        ├── SagaInFlightError          another live worker owns the saga
        ├── SagaStepUnsettled          a step runs where nobody can tell its worker dead
        │   └── SagaStepParked         a step or its undo waits for a person (recovery)
        └── SagaOwnershipLostError     this worker's saga was taken over meanwhile
    SagaStepCancelled                  a step's own task was cancelled: the saga rolls back
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_ledger.codes import ErrorCode
from agent_ledger.errors import EffectLedgerError

if TYPE_CHECKING:
    from agent_ledger.effects import Effect
    from agent_ledger.sagas._outcome import SagaOutcome
    from agent_ledger.stores.saga_base import SagaStep

__all__ = [
    "SagaCompensationFailed",
    "SagaError",
    "SagaFailed",
    "SagaInFlightError",
    "SagaNondeterminismError",
    "SagaOwnershipLostError",
    "SagaStepCancelled",
    "SagaStepParked",
    "SagaStepUnsettled",
]


class SagaError(EffectLedgerError):
    """Base class of the errors sagas raise."""


class SagaFailed(SagaError):
    """The saga was rolled back; ``outcome`` says what happened to every step.

    Raised from the step's own error (``__cause__``) when the failure happened
    in this run; a re-run of a saga that was already rolled back raises it
    from the stored outcome, running nothing.
    """

    def __init__(self, outcome: SagaOutcome, message: str | None = None) -> None:
        self.outcome = outcome
        self.saga_id = outcome.saga_id
        self.status = outcome.status
        why = f": {outcome.error.message}" if outcome.error is not None else ""
        super().__init__(message or f"saga {outcome.saga_id!r} was {outcome.status.value}{why}")


class SagaCompensationFailed(SagaFailed):
    """At least one compensation kept failing: the saga is ``compensation_failed``.

    ``outcome.failed_compensations`` lists them; a person must look
    (``agent-ledger sagas list --status compensation_failed``).
    """


class SagaNondeterminismError(SagaError):
    """The saga's code asked for a different step than the one recorded at that position.

    Raised before anything runs; the saga is left as it was. Also raised at
    the end of a block that did not reach every recorded step (``ran``: the
    steps it did reach ran), leaving the saga running: it is never completed
    with a step nobody asked for. Saga code must make the same calls in the
    same order on every run of one saga id.
    """

    def __init__(
        self, saga_id: str, position: int, recorded: str, asked: str, *, ran: bool = False
    ) -> None:
        self.saga_id = saga_id
        self.position = position
        what = "The saga is left running as it was" if ran else "Nothing was run"
        super().__init__(
            f"saga {saga_id!r}: step {position} was recorded as {recorded}, but the code now "
            f"asks for {asked}. {what}. A saga id must replay the same steps in the "
            "same order; start a new saga id for a different plan."
        )


class SagaInFlightError(SagaError):
    """Another worker owns the saga and is alive (its lease has not run out)."""

    def __init__(self, saga_id: str, owner: str | None, status: str) -> None:
        self.saga_id = saga_id
        self.owner = owner
        super().__init__(
            f"saga {saga_id!r} is {status} in another worker ({owner or 'unnamed'}) whose lease "
            "has not run out; run it again once that worker is gone, or let "
            "recover_sagas() finish it"
        )


class SagaOwnershipLostError(SagaError):
    """This worker's saga was taken over (its lease ran out): it may not go on."""

    def __init__(self, saga_id: str) -> None:
        self.saga_id = saga_id
        super().__init__(
            f"saga {saga_id!r} was taken over by another worker (this one stopped "
            "heartbeating past its lease); this worker stops here and undoes nothing"
        )


class SagaStepUnsettled(SagaError):
    """A step's forward effect is running in a worker that disabled takeover, so
    nobody can tell whether that worker is alive: the undo cannot start."""

    def __init__(self, saga_id: str, step: SagaStep) -> None:
        self.saga_id = saga_id
        self.position = step.position
        super().__init__(
            f"saga {saga_id!r}: step {step.position} ({step.tool}, key {step.idem_key[:12]}) "
            "is still processing in a worker that disabled takeover (StaleOptions("
            "after_ms=0)), so it cannot be told dead and the saga cannot be undone past it. "
            "The saga stays compensating: once that worker is gone, cancel the effect "
            "(ledger.cancel(key) or `agent-ledger cancel KEY`) and recover again."
        )


class SagaStepCancelled(EffectLedgerError):
    """The task of a step started with ``saga.start()`` was cancelled (by
    ``asyncio.wait_for`` timing out on it, say) while the saga's own task was
    not. That step failed, so the saga rolls back like for any failed step:
    this is the ``__cause__`` of the ``SagaFailed`` the block raises. Not a
    ``SagaError``: those leave the saga as it is, and a half-done saga must
    not be left so.
    """

    code = ErrorCode.STEP_CANCELED

    def __init__(self, position: int) -> None:
        self.position = position
        super().__init__(
            f"the task of step {position} (started with saga.start) was cancelled; "
            "the saga was rolled back as for a failed step"
        )


class SagaStepParked(SagaStepUnsettled):
    """A recovery pass met a step waiting for a person: its forward effect parked
    (an ambiguous attempt under ``on_stale="park"``: only that person can say
    whether it happened), or its compensation parked or sent for approval by
    its tool's policy. A pass must not wait for them while other sagas wait
    for it.

    ``effect`` is the compensation's effect when it is the undo that waits;
    None when it is the forward step.
    """

    def __init__(self, saga_id: str, step: SagaStep, effect: Effect | None = None) -> None:
        self.saga_id = saga_id
        self.position = step.position
        self.effect = effect
        if effect is None:
            what = (
                f"step {step.position} ({step.tool}, key {step.idem_key[:12]}) is parked for "
                "a person (its worker died mid-handler, so nobody knows whether it happened)"
            )
        elif effect.parked:
            what = (
                f"the compensation of step {step.position} ({effect.tool}, key "
                f"{effect.idem_key[:12]}) is parked for a person (its worker died "
                "mid-handler, so nobody knows whether the undo happened)"
            )
        else:
            what = (
                f"the compensation of step {step.position} ({effect.tool}, key "
                f"{effect.idem_key[:12]}) waits for a person's approval"
            )
        SagaError.__init__(
            self,
            f"saga {saga_id!r}: {what}. The saga stays compensating: settle it "
            "(`agent-ledger resolve`, `approve` or `deny` KEY) and the next recovery pass "
            "finishes it.",
        )
