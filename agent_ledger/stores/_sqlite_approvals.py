"""SqliteStore's approval steps (``ApprovalStore``), kept apart from its effect steps.

Every writing step runs in its own ``BEGIN IMMEDIATE`` transaction, like the
effect steps: ``decide``'s link check, settle, nonce and audit row see no
other writer in between, in this process or another, and land together.
Statements are in ``_sqlite_queries``.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent_ledger.approvals import (
    ApprovalRequest,
    DecisionAttempt,
    DecisionOutcome,
    NewDecisionAttempt,
)
from agent_ledger.codes import DecisionCode
from agent_ledger.effects import Effect
from agent_ledger.stores import _sqlite_queries as q
from agent_ledger.stores._params import Dialect
from agent_ledger.stores._sqlite_tables import SqliteTables, from_us, to_us
from agent_ledger.stores.approval_base import (
    LINK_ALREADY_USED,
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
    from agent_ledger.stores._dedup import PendingCounts
    from agent_ledger.stores._transactions import TransactionGate


def _request(row: tuple[Any, ...]) -> ApprovalRequest:
    return request_from_row(row, from_us)


class SqliteApprovals(SqliteTables):
    """Mixed into ``SqliteStore``: the approval tables of schema version 4."""

    if TYPE_CHECKING:
        _dialect: Dialect
        _gate: TransactionGate[Any]

        async def _one_counted(self, row: tuple[Any, ...], started: int, tx: Any) -> Effect: ...

        _counts: PendingCounts

    async def note_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        params = request_params(idem_key, requested_by, policy_version, deadline_ms)
        return await self._write_request("note_request", q.APPROVAL_INSERT, idem_key, params)

    async def renew_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        params = request_params(idem_key, requested_by, policy_version, deadline_ms)
        return await self._write_request("renew_request", q.APPROVAL_RENEW, idem_key, params)

    async def _write_request(
        self, operation: str, statement: str, idem_key: str, params: dict[str, object]
    ) -> ApprovalRequest:
        """``statement`` (insert or renew) on the request row, and the row it left."""
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> ApprovalRequest:
            conn.execute(statement, params | {"now": now})
            return request_from_row(conn.execute(q.APPROVAL_GET, (idem_key,)).fetchone(), from_us)

        return await self._run(operation, work, None, write=True, idem_key=idem_key)

    async def approval_request(
        self, idem_key: str, *, tx: object | None = None
    ) -> ApprovalRequest | None:
        return await self._read_one(
            "approval_request", q.APPROVAL_GET, (idem_key,), _request, tx, idem_key=idem_key
        )

    async def decide(self, request: DecideRequest) -> DecideOutcome:
        await self._enter(None)
        key = request.idem_key
        params = decide_params(self._dialect, request)
        audit = attempt_params(request.attempt, DecisionOutcome.ACCEPTED, DecisionCode.DECIDED)
        link = request.link
        started = self._counts.epoch

        def work(conn: sqlite3.Connection, now: int) -> tuple[Any, ...] | str | None:
            if link is not None and conn.execute(q.LINK_USED, (link.nonce,)).fetchone():
                return LINK_ALREADY_USED
            params["now"], params["at"] = now, from_us(now).isoformat()
            if conn.execute(q.SETTLE, params).rowcount != 1:
                return None
            if link is not None:
                conn.execute(
                    q.LINK_INSERT,
                    {
                        "nonce": link.nonce,
                        "idem_key": key,
                        "action": link.action.value,
                        "used_by": request.attempt.principal,
                        "now": now,
                        "expires": to_us(link.expires_at),
                    },
                )
            conn.execute(q.ATTEMPT_INSERT, audit | {"now": now})
            row: tuple[Any, ...] = conn.execute(q.FIND, (key,)).fetchone()
            return row

        moved = await self._run("decide", work, None, write=True, idem_key=key)
        if moved is None:
            return DecideOutcome(None)
        if isinstance(moved, str):
            return DecideOutcome(None, link_used=True)
        self._gate.changed(key, None)
        return DecideOutcome(await self._one_counted(moved, started, None))

    async def record_attempt(
        self, attempt: NewDecisionAttempt, *, outcome: DecisionOutcome, reason: DecisionCode
    ) -> None:
        await self._enter(None)
        params = attempt_params(attempt, outcome, reason)

        def work(conn: sqlite3.Connection, now: int) -> None:
            conn.execute(q.ATTEMPT_INSERT, params | {"now": now})

        await self._run("record_attempt", work, None, write=True, idem_key=attempt.idem_key)

    async def decision_attempts(
        self, idem_key: str | None = None, *, limit: int = 1000, tx: object | None = None
    ) -> list[DecisionAttempt]:
        await self._enter(tx)

        def work(conn: sqlite3.Connection, now: int) -> list[DecisionAttempt]:
            if idem_key is None:
                rows = conn.execute(q.ATTEMPTS_ALL, {"limit": limit}).fetchall()
            else:
                params = {"idem_key": idem_key, "limit": limit}
                rows = conn.execute(q.ATTEMPTS_OF, params).fetchall()
            return [attempt_from_row(row, from_us) for row in rows]

        return await self._run("decision_attempts", work, tx, write=False)

    async def overdue_approvals(self, *, limit: int = 500) -> list[ApprovalRequest]:
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> list[ApprovalRequest]:
            params = {"now": now, "limit": limit} | WAITING_PARAMS
            rows = conn.execute(q.APPROVALS_OVERDUE, params).fetchall()
            return [request_from_row(row, from_us) for row in rows]

        return await self._run("overdue_approvals", work, None, write=False)

    async def escalations_due(self, *, fraction: float, limit: int = 500) -> list[ApprovalRequest]:
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> list[ApprovalRequest]:
            params = {"now": now, "fraction": fraction, "limit": limit} | WAITING_PARAMS
            rows = conn.execute(q.ESCALATIONS_DUE, params).fetchall()
            return [request_from_row(row, from_us) for row in rows]

        return await self._run("escalations_due", work, None, write=False)

    async def mark_escalated(self, idem_key: str, *, created_at: datetime) -> bool:
        await self._enter(None)
        params = {"idem_key": idem_key, "created": to_us(created_at)}

        def work(conn: sqlite3.Connection, now: int) -> bool:
            return conn.execute(q.ESCALATION_MARK, params | {"now": now}).rowcount == 1

        return await self._run("mark_escalated", work, None, write=True, idem_key=idem_key)
