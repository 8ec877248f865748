"""MemoryStore's approval steps (``ApprovalStore``): the in-process twin of schema
version 4's approval tables.

Each step is synchronous once it has waited out another task's open
transaction, so it is atomic without a lock: ``decide`` checks the link,
settles and records in one turn of the event loop.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent_ledger.approvals import (
    ApprovalRequest,
    DecisionAttempt,
    DecisionOutcome,
    NewDecisionAttempt,
    UsedLink,
)
from agent_ledger.codes import DecisionCode, ErrorCode
from agent_ledger.effects import Effect, EffectError
from agent_ledger.status import EffectStatus
from agent_ledger.stores.approval_base import DecideOutcome, DecideRequest
from agent_ledger.stores.base import Decision

if TYPE_CHECKING:
    from agent_ledger.clock import Clock
    from agent_ledger.stores._transactions import TransactionGate


class MemoryApprovals:
    """Mixed into ``MemoryStore``: approval requests, decision attempts, used links."""

    if TYPE_CHECKING:
        _clock: Clock
        _gate: TransactionGate[Any]
        _rows: dict[str, Any]

        async def settle(
            self,
            idem_key: str,
            *,
            target: EffectStatus,
            decision: Decision,
            expected_attempt: int | None = None,
            only_parked: bool = False,
            result_json: str | None = None,
            error: EffectError | None = None,
        ) -> Effect | None: ...

    def _init_approvals(self) -> None:
        self._requests: dict[str, ApprovalRequest] = {}
        self._attempts: list[DecisionAttempt] = []
        self._links: dict[str, UsedLink] = {}

    async def _approval_turn(self) -> None:
        if self._gate.active is not None:
            await self._gate.enter(None)

    async def note_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        await self._approval_turn()
        found = self._requests.get(idem_key)
        if found is not None:
            return found
        return self._new_request(idem_key, (requested_by, policy_version), deadline_ms)

    async def renew_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        await self._approval_turn()
        return self._new_request(idem_key, (requested_by, policy_version), deadline_ms)

    def _new_request(
        self, idem_key: str, who: tuple[str | None, str | None], deadline_ms: int | None
    ) -> ApprovalRequest:
        """Store a new request for ``idem_key`` (replacing any): ``who`` is who
        asked and under which policy version."""
        now = self._clock()
        deadline = None if deadline_ms is None else now + timedelta(milliseconds=deadline_ms)
        request = ApprovalRequest(idem_key, *who, deadline, None, now)
        self._requests[idem_key] = request
        return request

    async def approval_request(
        self, idem_key: str, *, tx: object | None = None
    ) -> ApprovalRequest | None:
        return self._requests.get(idem_key)

    async def decide(self, request: DecideRequest) -> DecideOutcome:
        await self._approval_turn()
        # From here to the end nothing awaits anything that suspends (settle
        # waits only for an open transaction, and none can open meanwhile).
        link = request.link
        if link is not None and link.nonce in self._links:
            return DecideOutcome(None, link_used=True)
        moved = await self.settle(
            request.idem_key,
            target=request.target,
            decision=request.decision,
            expected_attempt=request.expected_attempt,
            only_parked=request.only_parked,
            result_json=request.result_json,
            error=request.error,
        )
        if moved is None:
            return DecideOutcome(None)
        if link is not None:
            self._links[link.nonce] = link
        self._append(request.attempt, DecisionOutcome.ACCEPTED, DecisionCode.DECIDED)
        return DecideOutcome(moved)

    def _append(
        self, attempt: NewDecisionAttempt, outcome: DecisionOutcome, reason: DecisionCode
    ) -> None:
        self._attempts.append(
            DecisionAttempt(
                id=len(self._attempts) + 1,
                idem_key=attempt.idem_key,
                principal=attempt.principal,
                channel=attempt.channel,
                action=attempt.action,
                outcome=outcome,
                reason_code=reason,
                intent_hash=attempt.intent_hash,
                note=attempt.note,
                at=self._clock(),
            )
        )

    async def record_attempt(
        self, attempt: NewDecisionAttempt, *, outcome: DecisionOutcome, reason: DecisionCode
    ) -> None:
        await self._approval_turn()
        self._append(attempt, outcome, reason)

    async def decision_attempts(
        self, idem_key: str | None = None, *, limit: int = 1000, tx: object | None = None
    ) -> list[DecisionAttempt]:
        rows = [a for a in self._attempts if idem_key is None or a.idem_key == idem_key]
        return rows[:limit]

    async def overdue_approvals(self, *, limit: int = 500) -> list[ApprovalRequest]:
        now = self._clock()
        due = [
            r
            for r in self._requests.values()
            if r.deadline_at is not None and r.deadline_at <= now and self._awaits_approval(r)
        ]
        due.sort(key=lambda r: (r.deadline_at, r.idem_key))
        return due[:limit]

    async def escalations_due(self, *, fraction: float, limit: int = 500) -> list[ApprovalRequest]:
        now = self._clock()
        due = [
            r
            for r in self._requests.values()
            if r.deadline_at is not None
            and r.escalated_at is None
            and now < r.deadline_at
            and r.created_at + (r.deadline_at - r.created_at) * fraction <= now
            and self._awaits_approval(r)
        ]
        due.sort(key=lambda r: (r.deadline_at, r.idem_key))
        return due[:limit]

    async def mark_escalated(self, idem_key: str, *, created_at: datetime) -> bool:
        await self._approval_turn()
        found = self._requests.get(idem_key)
        if found is None or found.escalated_at is not None or found.created_at != created_at:
            return False
        self._requests[idem_key] = replace(found, escalated_at=self._clock())
        return True

    def _awaits_approval(self, request: ApprovalRequest) -> bool:
        """Its effect waits for an approval (``requires_approval``, not parked)."""
        row = self._rows.get(request.idem_key)
        return (
            row is not None
            and row.status is EffectStatus.REQUIRES_APPROVAL
            and (row.error is None or row.error.code != ErrorCode.AMBIGUOUS_ATTEMPT)
        )
