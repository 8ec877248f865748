"""The approval steps every store implements beside ``Store`` (schema version 4).

``ApprovalStore`` keeps what issue 28's approvals need: each request's asker,
policy version and deadline (``agent_ledger_approvals``), every decision
attempt (``agent_ledger_decision_attempts``, the audit trail) and the signed
links already used (``agent_ledger_used_links``). The ledger decides policy
(who may decide, whether the intent matches); the store makes each step
atomic, as for the effect steps:

- :meth:`ApprovalStore.decide` is ``Store.settle`` plus, in the same
  transaction, the link's nonce and the accepted attempt's row: a decision
  and its audit row land together or not at all, and a link decides once.
- The other steps are single statements.

None of these steps is repeated after a lost reply (``decide`` like
``settle``; a repeated ``record_attempt`` would write the row twice), except
the reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

from agent_ledger.approvals import (
    ApprovalRequest,
    Channel,
    DecisionAction,
    DecisionAttempt,
    DecisionOutcome,
    NewDecisionAttempt,
    UsedLink,
)
from agent_ledger.codes import DecisionCode, ErrorCode
from agent_ledger.effects import Effect, EffectError
from agent_ledger.status import EffectStatus
from agent_ledger.stores._params import Dialect, settle_params
from agent_ledger.stores.base import Decision, check_settle_target

__all__ = [
    "ApprovalStore",
    "DecideOutcome",
    "DecideRequest",
    "attempt_from_row",
    "attempt_params",
    "request_from_row",
    "request_params",
]


@dataclass(frozen=True, slots=True)
class DecideRequest:
    """A person's approve, deny or resolve, with who made it and how (see ``decide``)."""

    idem_key: str
    target: EffectStatus
    decision: Decision
    attempt: NewDecisionAttempt
    expected_attempt: int | None = None
    only_parked: bool = False
    result_json: str | None = None
    error: EffectError | None = None
    #: The signed link that carried it; its nonce is consumed with the decision.
    link: UsedLink | None = None

    def __post_init__(self) -> None:
        check_settle_target(self.target)


class DecideOutcome(NamedTuple):
    """``effect``: the settled effect when this call decided (None: nothing changed).
    ``link_used``: the link's nonce had already decided, so nothing was tried."""

    effect: Effect | None
    link_used: bool = False


@runtime_checkable
class ApprovalStore(Protocol):
    """The approval steps of a store (schema version 4)."""

    async def note_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        """Record that ``idem_key`` was asked of a person, unless already recorded.

        Insert-or-get in one statement: the first request's asker, policy
        version and deadline (``deadline_ms`` from now by the store's clock;
        None: none) stand, and a later call returns them unchanged, so a
        deadline is never pushed back by asking again. Returns the row as
        stored.
        """
        ...

    async def renew_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        """Record a new request for ``idem_key``, replacing any earlier one.

        For an effect that goes back to a person after it left
        ``requires_approval`` (an approval taken back, a holder's own step,
        an approval refused at run time because the intent changed): the
        new asker, policy version and deadline (from now, by the store's
        clock) replace the old, ``escalated_at`` is cleared and
        ``created_at`` is now. One statement (upsert). Returns the row.
        """
        ...

    async def approval_request(
        self, idem_key: str, *, tx: object | None = None
    ) -> ApprovalRequest | None:
        """The request recorded for ``idem_key``, or None (inside ``tx`` when given)."""
        ...

    async def decide(self, request: DecideRequest) -> DecideOutcome:
        """``Store.settle`` with its audit row and link, in one transaction.

        With ``request.link``: if its nonce is already recorded, change
        nothing and return ``link_used=True``. Otherwise apply exactly what
        ``settle`` would (compare-and-set ``requires_approval`` -> target at
        ``expected_attempt``, ``only_parked``; history, decision fields). If
        it applied, record the link's nonce (when given) and
        ``request.attempt`` as ``accepted`` with reason ``decided``, and
        return the effect. If it did not, change nothing (no nonce, no row)
        and return ``DecideOutcome(None)``: the caller records the refusal
        with its reason. Of concurrent decides on one effect or one nonce,
        exactly one applies. Wakes subscribers.
        """
        ...

    async def record_attempt(
        self, attempt: NewDecisionAttempt, *, outcome: DecisionOutcome, reason: DecisionCode
    ) -> None:
        """Append one row to the decision audit trail (a refused attempt, mostly)."""
        ...

    async def decision_attempts(
        self, idem_key: str | None = None, *, limit: int = 1000, tx: object | None = None
    ) -> list[DecisionAttempt]:
        """The audit trail, oldest first: ``idem_key``'s attempts, or every effect's
        (inside ``tx`` when given: a run claiming an approved effect in a caller's
        transaction reads it there)."""
        ...

    async def overdue_approvals(self, *, limit: int = 500) -> list[ApprovalRequest]:
        """Requests whose deadline has passed by the store's clock and whose effect
        still waits for an approval (``requires_approval``, not parked), oldest
        deadline first. Read, then acted on: the effect may be decided
        meanwhile, so the caller's settle is a compare-and-set."""
        ...

    async def escalations_due(self, *, fraction: float, limit: int = 500) -> list[ApprovalRequest]:
        """Requests not yet escalated, whose effect still waits for an approval,
        and which have used ``fraction`` (0 < fraction < 1) of the time from
        ``created_at`` to ``deadline_at`` by the store's clock (deadline not
        yet passed), oldest deadline first."""
        ...

    async def mark_escalated(self, idem_key: str, *, created_at: datetime) -> bool:
        """Stamp ``escalated_at`` on the request made at ``created_at``, unless it is
        stamped already (or was renewed since); True if this call stamped it.
        One compare-and-set: of any number of sweepers exactly one gets True."""
        ...


#: What a SQL store's ``decide`` transaction answers when the link had already decided.
LINK_ALREADY_USED: Final = "link used"
#: The parameters naming an effect that waits for an approval (not parked), every SQL dialect.
WAITING_PARAMS: Final = {
    "waiting": EffectStatus.REQUIRES_APPROVAL.value,
    "ambiguous": ErrorCode.AMBIGUOUS_ATTEMPT.value,
}


def decide_params(dialect: Dialect, request: DecideRequest) -> dict[str, object]:
    """The parameters of the settle a ``decide`` makes, every SQL dialect."""
    return settle_params(
        dialect,
        request.idem_key,
        target=request.target,
        expected_attempt=request.expected_attempt,
        only_parked=request.only_parked,
        result_json=request.result_json,
        error=request.error,
        decision=request.decision,
    )


def request_params(
    idem_key: str, requested_by: str | None, policy_version: str | None, deadline_ms: int | None
) -> dict[str, object]:
    """The parameters of ``note_request`` and ``renew_request``'s statements, every dialect."""
    return {
        "idem_key": idem_key,
        "requested_by": requested_by,
        "policy_version": policy_version,
        "deadline_ms": deadline_ms,
    }


def request_from_row(row: tuple[Any, ...], to_time: Any) -> ApprovalRequest:
    """An ``ApprovalRequest`` from ``(idem_key, requested_by, policy_version,
    deadline, escalated, created)``, times converted by ``to_time``."""
    key, by, policy, deadline, escalated, created = row
    return ApprovalRequest(
        idem_key=key,
        requested_by=by,
        policy_version=policy,
        deadline_at=None if deadline is None else to_time(deadline),
        escalated_at=None if escalated is None else to_time(escalated),
        created_at=to_time(created),
    )


def attempt_from_row(row: tuple[Any, ...], to_time: Any) -> DecisionAttempt:
    """A ``DecisionAttempt`` from a row in the table's column order."""
    id_, key, principal, channel, action, outcome, reason, shown, note, at = row
    return DecisionAttempt(
        id=int(id_),
        idem_key=key,
        principal=principal,
        channel=Channel(channel),
        action=DecisionAction(action),
        outcome=DecisionOutcome(outcome),
        reason_code=DecisionCode(reason),
        intent_hash=shown,
        note=note,
        at=to_time(at),
    )


def attempt_params(
    attempt: NewDecisionAttempt, outcome: DecisionOutcome, reason: DecisionCode
) -> dict[str, object]:
    """The named parameters of an attempt row's insert (every dialect)."""
    return {
        "a_idem_key": attempt.idem_key,
        "a_principal": attempt.principal,
        "a_channel": attempt.channel.value,
        "a_action": attempt.action.value,
        "a_outcome": outcome.value,
        "a_reason": reason.value,
        "a_intent": attempt.intent_hash,
        "a_note": attempt.note,
    }
