"""PostgresStore's approval steps (``ApprovalStore``), kept apart from its effect steps.

``decide`` is one transaction: the link's nonce first (its primary key makes
a second use wait, then find it taken), then the settle compare-and-set (the
row lock makes concurrent deciders queue, and all but the first match
nothing), then the audit row. A settle that does not apply rolls the nonce
back, so a link is consumed only by the decision it made. Statements are in
``_postgres_queries``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from psycopg import sql

from agent_ledger.approvals import (
    ApprovalRequest,
    DecisionAttempt,
    DecisionOutcome,
    NewDecisionAttempt,
)
from agent_ledger.codes import DecisionCode
from agent_ledger.effects import Effect
from agent_ledger.errors import EffectLedgerPermissionError
from agent_ledger.stores import _postgres_queries as q
from agent_ledger.stores._params import Dialect
from agent_ledger.stores._postgres_tables import Connection, PostgresTables, utc
from agent_ledger.stores.approval_base import (
    WAITING_PARAMS,
    DecideOutcome,
    DecideRequest,
    attempt_from_row,
    attempt_params,
    decide_params,
    request_from_row,
    request_params,
)

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from agent_ledger.stores._dedup import PendingCounts

APPROVALS_TABLE: Final = "agent_ledger_approvals"
ATTEMPTS_TABLE: Final = "agent_ledger_decision_attempts"
LINKS_TABLE: Final = "agent_ledger_used_links"
_EFFECTS_TABLE: Final = "agent_ledger_effects"


#: The role set's refusals of a decision, as recorded in the audit trail.
_DATABASE_REFUSALS: Final = frozenset(
    {DecisionCode.NOT_AN_APPROVER, DecisionCode.SELF_DECISION, DecisionCode.UNKNOWN_REQUESTER}
)


class _NotSettled(Exception):
    """Raised inside decide's transaction to roll the nonce back."""


class PostgresApprovals(PostgresTables):
    """Mixed into ``PostgresStore``: the approval tables of schema version 4."""

    if TYPE_CHECKING:
        _dialect: Dialect
        _settle: bytes | sql.Composed
        _counts: PendingCounts

        def transaction(self) -> AbstractAsyncContextManager[Connection]: ...

        async def _one_counted(self, row: tuple[Any, ...], started: int, tx: Any) -> Effect: ...

    def _approval_sql(self, text: Any) -> sql.Composed:
        return sql.SQL(text).format(
            approvals=sql.Identifier(self.schema, APPROVALS_TABLE),
            attempts=sql.Identifier(self.schema, ATTEMPTS_TABLE),
            links=sql.Identifier(self.schema, LINKS_TABLE),
            effects=sql.Identifier(self.schema, _EFFECTS_TABLE),
        )

    async def _rows(
        self, operation: str, text: Any, params: Mapping[str, object], tx: object | None = None
    ) -> list[tuple[Any, ...]]:
        query = self._approval_sql(text)

        async def work(conn: Connection) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(query, params)
            return await cursor.fetchall() if cursor.description is not None else []

        return await self._statement(operation, work, tx)

    async def note_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        params = request_params(idem_key, requested_by, policy_version, deadline_ms)
        (row,) = await self._rows("note_request", q.APPROVAL_NOTE, params)
        return request_from_row(row, utc)

    async def renew_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        params = request_params(idem_key, requested_by, policy_version, deadline_ms)
        (row,) = await self._rows("renew_request", q.APPROVAL_RENEW, params)
        return request_from_row(row, utc)

    async def approval_request(
        self, idem_key: str, *, tx: object | None = None
    ) -> ApprovalRequest | None:
        rows = await self._rows("approval_request", q.APPROVAL_GET, {"idem_key": idem_key}, tx)
        return request_from_row(rows[0], utc) if rows else None

    async def decide(self, request: DecideRequest) -> DecideOutcome:
        key = request.idem_key
        params = decide_params(self._dialect, request)
        audit = attempt_params(request.attempt, DecisionOutcome.ACCEPTED, DecisionCode.DECIDED)
        link = request.link
        consume = self._approval_sql(q.LINK_CONSUME)
        insert = self._approval_sql(q.ATTEMPT_INSERT)
        settle = self._settle
        started = self._counts.epoch

        async def work(conn: Connection) -> tuple[Any, ...] | None:
            if link is not None:
                cursor = await conn.execute(
                    consume,
                    {
                        "nonce": link.nonce,
                        "idem_key": key,
                        "action": link.action.value,
                        "used_by": request.attempt.principal,
                        "expires_at": link.expires_at,
                    },
                )
                if await cursor.fetchone() is None:
                    return None
            cursor = await conn.execute(settle, params)
            row: tuple[Any, ...] | None = await cursor.fetchone()
            if row is None:
                raise _NotSettled
            await conn.execute(insert, audit)
            return row

        try:
            async with self.transaction() as tx:
                row = await self._statement("decide", work, tx, idem_key=key)
        except _NotSettled:
            return DecideOutcome(None)
        except EffectLedgerPermissionError as refused:
            # The role set's trigger refused it (postgres_roles.sql): the
            # refusal goes to the audit trail too, when this role may write it
            # (an approver refused by separation of duty; a worker may not).
            await self._record_refusal(request, refused)
            raise
        if row is None:
            return DecideOutcome(None, link_used=True)
        return DecideOutcome(await self._one_counted(row, started, None))

    async def _record_refusal(
        self, request: DecideRequest, refused: EffectLedgerPermissionError
    ) -> None:
        if refused.code not in _DATABASE_REFUSALS:
            return
        with contextlib.suppress(EffectLedgerPermissionError):
            await self.record_attempt(
                request.attempt,
                outcome=DecisionOutcome.REFUSED,
                reason=DecisionCode(refused.code),
            )

    async def record_attempt(
        self, attempt: NewDecisionAttempt, *, outcome: DecisionOutcome, reason: DecisionCode
    ) -> None:
        await self._rows(
            "record_attempt", q.ATTEMPT_INSERT, attempt_params(attempt, outcome, reason)
        )

    async def decision_attempts(
        self, idem_key: str | None = None, *, limit: int = 1000, tx: object | None = None
    ) -> list[DecisionAttempt]:
        if idem_key is None:
            rows = await self._rows("decision_attempts", q.ATTEMPTS_ALL, {"limit": limit}, tx)
        else:
            params = {"idem_key": idem_key, "limit": limit}
            rows = await self._rows("decision_attempts", q.ATTEMPTS_OF, params, tx)
        return [attempt_from_row(row, utc) for row in rows]

    async def overdue_approvals(self, *, limit: int = 500) -> list[ApprovalRequest]:
        params = {"limit": limit} | WAITING_PARAMS
        rows = await self._rows("overdue_approvals", q.APPROVALS_OVERDUE, params)
        return [request_from_row(row, utc) for row in rows]

    async def escalations_due(self, *, fraction: float, limit: int = 500) -> list[ApprovalRequest]:
        params = {"fraction": fraction, "limit": limit} | WAITING_PARAMS
        rows = await self._rows("escalations_due", q.ESCALATIONS_DUE, params)
        return [request_from_row(row, utc) for row in rows]

    async def mark_escalated(self, idem_key: str, *, created_at: datetime) -> bool:
        query = self._approval_sql(q.ESCALATION_MARK)
        params = {"idem_key": idem_key, "created_at": created_at}

        async def work(conn: Connection) -> bool:
            cursor = await conn.execute(query, params)
            return cursor.rowcount == 1

        return await self._statement("mark_escalated", work, None)
