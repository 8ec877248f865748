"""What a store keeps for sagas, and the small Protocol through which it keeps it.

A saga is a row with a fenced owner (``attempt`` + ``heartbeat_at`` +
``lease_ms``, as an effect has) and an ordered list of steps. A step row says
*which* effect a position of the saga is (its forward key) and *how* to undo
it (the compensation tool and its key); what happened to the effect lives in
the effect itself. So a step is written once, before its forward effect
begins, and never updated: a crash between the step row and the effect
cannot hide a step, and nothing in a step row can disagree with a receipt.

This is kept apart from :class:`~agent_ledger.stores.base.Store` so that the
effect protocol stays focused: a store that keeps sagas implements both.
Like ``Store``, each method is one atomic step; ``True``/a record means "this
call made the change", ``False``/``None`` "the precondition did not hold,
nothing changed". Times and staleness use the store's clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, Literal, NamedTuple, Protocol, runtime_checkable

import orjson

from agent_ledger.effects import EffectError
from agent_ledger.errors import EffectLedgerValidationError


class SagaStatus(enum.StrEnum):
    #: The owner is running forward steps.
    RUNNING = "running"
    #: Every step ran (or failed with a "step" failure scope). Terminal.
    COMPLETED = "completed"
    #: A step failed (or the owner gave up): completed steps are being undone.
    COMPENSATING = "compensating"
    #: Rolled back after a failure: every compensation that was due succeeded. Terminal.
    COMPENSATED = "compensated"
    #: At least one compensation kept failing: a person must look. Terminal.
    COMPENSATION_FAILED = "compensation_failed"
    #: Rolled back because the task running it was cancelled. Terminal.
    CANCELED = "canceled"

    @property
    def is_terminal(self) -> bool:
        return self in SAGA_TERMINAL


_G = SagaStatus
#: The saga's state machine. running -> running and compensating ->
#: compensating are takeovers (a claim, attempt + 1).
SAGA_TRANSITIONS: Final[Mapping[SagaStatus, frozenset[SagaStatus]]] = MappingProxyType(
    {
        _G.RUNNING: frozenset({_G.RUNNING, _G.COMPLETED, _G.COMPENSATING}),
        _G.COMPENSATING: frozenset(
            {_G.COMPENSATING, _G.COMPENSATED, _G.COMPENSATION_FAILED, _G.CANCELED}
        ),
        _G.COMPLETED: frozenset(),
        _G.COMPENSATED: frozenset(),
        _G.COMPENSATION_FAILED: frozenset(),
        _G.CANCELED: frozenset(),
    }
)
SAGA_TERMINAL: Final[frozenset[SagaStatus]] = frozenset(
    s for s, out in SAGA_TRANSITIONS.items() if not out
)
#: Statuses with an owner that must keep heartbeating.
SAGA_OPEN: Final[frozenset[SagaStatus]] = frozenset(SagaStatus) - SAGA_TERMINAL

CompensateIf = Literal["succeeded", "attempted"]
OnCompensationFailure = Literal["continue", "stop"]
COMPENSATE_IF: Final = ("succeeded", "attempted")
ON_COMPENSATION_FAILURE: Final = ("continue", "stop")


@dataclass(frozen=True, slots=True)
class SagaRecord:
    """A saga as stored."""

    saga_id: str
    status: SagaStatus
    #: Fencing token: +1 on every claim (a re-run of its code, a recoverer).
    attempt: int
    #: Who holds it (free text, for people: host and pid by default).
    owner: str | None
    lease_ms: int
    heartbeat_at: datetime
    #: A running saga idle this long is compensated by ``recover_sagas()``; None: never.
    abandon_after_ms: int | None
    on_compensation_failure: OnCompensationFailure
    #: Why it was rolled back (the failing step's error), or why compensation failed.
    error: EffectError | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None


class NewSaga(NamedTuple):
    """What ``begin_saga`` inserts when the id is new."""

    saga_id: str
    owner: str | None
    lease_ms: int
    abandon_after_ms: int | None
    on_compensation_failure: OnCompensationFailure


@dataclass(frozen=True, slots=True)
class SagaStep:
    """One position of a saga: which effect it is and how to undo it."""

    saga_id: str
    position: int
    #: Steps of one ``saga.parallel()`` share a group; every other step has its own.
    group_index: int
    tool: str
    #: The forward effect's idempotency key.
    idem_key: str
    #: The compensation tool's name, and the key of its effect (from ``idem_key``).
    compensation: str | None
    compensation_key: str | None
    compensate_if: CompensateIf
    created_at: datetime


class NewSagaStep(NamedTuple):
    position: int
    group_index: int
    tool: str
    idem_key: str
    compensation: str | None
    compensation_key: str | None
    compensate_if: CompensateIf


class SagaBegin(NamedTuple):
    """``saga`` as stored after ``begin_saga``; ``created``: this call inserted it."""

    saga: SagaRecord
    created: bool


@runtime_checkable
class SagaStore(Protocol):
    """Where sagas live; see the module doc for the shared rules."""

    async def begin_saga(self, new: NewSaga) -> SagaBegin:
        """Insert-or-get: a new id is inserted ``running``, ``attempt=1``,
        ``heartbeat_at=now``; an existing one is returned as stored, unchanged.
        Exactly one of concurrent begins for an id gets ``created=True``."""
        ...

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
        """Take the saga over: compare-and-set ``expect`` -> ``then`` if its
        heartbeat is older than both its holder's lease and ``idle_ms``, by the
        store's clock (a lease of 0 is never taken over). Sets ``attempt + 1``,
        ``heartbeat_at=now``, the new ``lease_ms`` and ``owner``. Of concurrent
        claims exactly one wins; the winner gets the saga as it now stands,
        every other caller None."""
        ...

    async def heartbeat_saga(self, saga_id: str, *, attempt: int) -> bool:
        """``heartbeat_at=now`` if the saga is open and still at ``attempt``."""
        ...

    async def release_saga(self, saga_id: str, *, attempt: int) -> bool:
        """Give the saga up at once: if it is ``compensating`` at ``attempt``, set
        its heartbeat so far back that the next claim may take it (a recovery
        pass that ran out of wait, so the next pass need not wait out its lease)."""
        ...

    async def finish_saga(
        self,
        saga_id: str,
        *,
        attempt: int,
        expect: SagaStatus,
        then: SagaStatus,
        error: EffectError | None,
    ) -> bool:
        """Compare-and-set ``expect`` -> ``then`` at ``attempt`` (the owner's
        moves: running -> completed or compensating, compensating -> an end).
        Records ``error`` when given; ``completed_at`` when ``then`` is terminal.
        Raises ``EffectLedgerValidationError`` for a move the table forbids."""
        ...

    async def record_step(
        self, saga_id: str, *, attempt: int, step: NewSagaStep
    ) -> SagaStep | None:
        """Insert the step at its position if the saga is ``running`` at
        ``attempt`` (fenced, and serialized with claims: a step can never be
        added after a takeover has read the steps). Returns the step stored at
        that position (the one inserted, or the one already there, which the
        caller compares with its own), or None if the caller no longer owns
        the running saga."""
        ...

    async def get_saga(self, saga_id: str) -> SagaRecord | None: ...

    async def saga_steps(self, saga_id: str) -> list[SagaStep]:
        """The saga's steps by position."""
        ...

    async def list_sagas(
        self, *, statuses: frozenset[SagaStatus] | None = None, limit: int = 100
    ) -> list[SagaRecord]:
        """Up to ``limit`` sagas in ``statuses`` (all when None), newest first."""
        ...

    async def claimable_sagas(
        self, *, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> list[SagaRecord]:
        """Up to ``limit`` sagas a recoverer's claim could take now, oldest
        (``created_at``, then ``saga_id``) first, strictly after the cursor
        ``after`` (the ``created_at`` and ``saga_id`` of the last one of the
        previous page). Claimable: ``compensating`` with a heartbeat older than
        its lease, or ``running`` with an ``abandon_after_ms`` and a heartbeat
        older than both its lease and that (a lease of 0 is never claimable).
        Selected in the store, so newer sagas that cannot be claimed never hide
        an older one that can."""
        ...


#: The most sagas one ``list_sagas`` / ``claimable_sagas`` call returns (as for effects).
MAX_SAGA_PAGE: Final = 1_000


def check_saga_limit(limit: object) -> int:
    """``limit`` for ``list_sagas``/``claimable_sagas``/``recover_sagas``, checked once
    here so that every store refuses the same values the same way (a negative
    LIMIT meant "all" in SQLite and an error in PostgreSQL)."""
    if type(limit) is not int or not 1 <= limit <= MAX_SAGA_PAGE:
        raise EffectLedgerValidationError(
            f"limit must be an int from 1 to {MAX_SAGA_PAGE}, got {limit!r}", field="limit"
        )
    return limit


def check_saga_move(expect: SagaStatus, then: SagaStatus) -> None:
    """Raise unless the saga table allows ``expect -> then`` as an owner's move."""
    if then is expect or then not in SAGA_TRANSITIONS[expect]:
        raise EffectLedgerValidationError(
            f"a saga cannot move from {expect.value!r} to {then.value!r}", field="then"
        )


def claim_saga_params(
    saga_id: str,
    expect: SagaStatus,
    then: SagaStatus,
    lease_ms: int,
    idle_ms: int,
    owner: str | None,
) -> dict[str, object]:
    """The parameters of ``claim_saga``'s statement, every SQL dialect."""
    return {
        "saga_id": saga_id,
        "expect": expect.value,
        "then": then.value,
        "lease_ms": lease_ms,
        "idle_ms": idle_ms,
        "owner": owner,
    }


def release_saga_params(saga_id: str, attempt: int) -> dict[str, object]:
    """The parameters of ``release_saga``'s statement, every SQL dialect."""
    return {"saga_id": saga_id, "attempt": attempt, "compensating": SagaStatus.COMPENSATING.value}


def finish_saga_params(
    saga_id: str, attempt: int, expect: SagaStatus, then: SagaStatus
) -> dict[str, object]:
    """The parameters of ``finish_saga``'s statement but its error, every SQL dialect
    (PostgreSQL adds ``saga_error_json``, the others ``saga_error_columns``)."""
    return {
        "saga_id": saga_id,
        "attempt": attempt,
        "expect": expect.value,
        "then": then.value,
        "terminal": then.is_terminal,
    }


def saga_error_columns(error: EffectError | None) -> dict[str, object]:
    """A saga's error as the columns SQLite and MySQL keep it in; ``has_error``
    False keeps the stored one."""
    return {
        "has_error": error is not None,
        "error_message": None if error is None else error.message,
        "error_code": None if error is None else error.code,
    }


def saga_error_json(error: EffectError | None) -> str | None:
    """The stored form of a saga's error (JSON text), as effects keep theirs."""
    if error is None:
        return None
    return orjson.dumps({"message": error.message, "code": error.code}).decode()


def saga_error_from(message: str | None, code: str | None) -> EffectError | None:
    return None if message is None else EffectError(message=message, code=code)


#: The saga columns every SQL store selects, in the order ``saga_from_row`` reads them
#: (times and the error as each store keeps them: see its query module).
SAGA_ROW: Final = (
    "saga_id", "status", "attempt", "owner", "lease_ms", "heartbeat", "abandon_after_ms",
    "on_compensation_failure", "error_message", "error_code", "created", "updated", "completed",
)  # fmt: skip
#: Likewise for steps.
STEP_ROW: Final = (
    "saga_id", "position", "group_index", "tool", "idem_key", "compensation",
    "compensation_key", "compensate_if", "created",
)  # fmt: skip
_SAGA_STATUS_BY_VALUE: Final = {s.value: s for s in SagaStatus}


def saga_from_row(row: Sequence[Any], when: Callable[[Any], datetime]) -> SagaRecord:
    """A ``SagaRecord`` from a row in ``SAGA_ROW`` order; ``when`` reads a stored time."""
    (saga_id, status, attempt, owner, lease_ms, heartbeat, abandon_after_ms, on_failure,
     message, code, created, updated, completed) = row  # fmt: skip
    return SagaRecord(
        saga_id=saga_id,
        status=_SAGA_STATUS_BY_VALUE[status],
        attempt=int(attempt),
        owner=owner,
        lease_ms=int(lease_ms),
        heartbeat_at=when(heartbeat),
        abandon_after_ms=None if abandon_after_ms is None else int(abandon_after_ms),
        on_compensation_failure=on_failure,
        error=saga_error_from(message, code),
        created_at=when(created),
        updated_at=when(updated),
        completed_at=None if completed is None else when(completed),
    )


def step_from_row(row: Sequence[Any], when: Callable[[Any], datetime]) -> SagaStep:
    """A ``SagaStep`` from a row in ``STEP_ROW`` order."""
    saga_id, position, group_index, tool, idem_key, compensation, comp_key, comp_if, created = row
    return SagaStep(
        saga_id=saga_id,
        position=int(position),
        group_index=int(group_index),
        tool=tool,
        idem_key=idem_key,
        compensation=compensation,
        compensation_key=comp_key,
        compensate_if=comp_if,
        created_at=when(created),
    )
