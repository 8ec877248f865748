"""MySQLStore's approval steps (``ApprovalStore``), kept apart from its effect steps.

``decide`` is one InnoDB transaction: the link's check, the settle
compare-and-set (its row lock queues concurrent deciders, and all but the
first match nothing), the nonce's insert (a concurrent use that inserted it
first makes this transaction roll back, settle included) and the audit row.
Statements are in ``_mysql_queries``.
"""

from __future__ import annotations

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
from agent_ledger.stores import _mysql_queries as q
from agent_ledger.stores._mysql_tables import Cursor, MySQLTables, insert_new, stored, utc
from agent_ledger.stores._params import Dialect
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


def _request(row: tuple[Any, ...]) -> ApprovalRequest:
    return request_from_row(row, utc)


class MySQLApprovals(MySQLTables):
    """Mixed into ``MySQLStore``: the approval tables of schema version 4."""

    if TYPE_CHECKING:
        _dialect: Dialect
        _counts: PendingCounts

        def _changed(self, idem_key: str, conn: Any) -> None: ...

        async def _counted(
            self, rows: list[tuple[Any, ...]], started: int, conn: Any
        ) -> list[tuple[Any, ...]]: ...

        def _effect_of_row(self, row: tuple[Any, ...]) -> Effect: ...

    async def note_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        params = request_params(idem_key, requested_by, policy_version, deadline_ms)
        return await self._write_request("note_request", idem_key, params, renew=False)

    async def renew_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        params = request_params(idem_key, requested_by, policy_version, deadline_ms)
        return await self._write_request("renew_request", idem_key, params, renew=True)

    async def _write_request(
        self, operation: str, idem_key: str, params: dict[str, object], *, renew: bool
    ) -> ApprovalRequest:
        """Insert the request row (kept if there is one) or renew it, and read the row it left."""

        async def work(cur: Cursor) -> ApprovalRequest:
            if renew:
                await cur.execute(q.APPROVAL_RENEW, params)
            else:
                await insert_new(cur, q.APPROVAL_INSERT, params)
            await cur.execute(q.APPROVAL_GET, params)
            return request_from_row(await cur.fetchone(), utc)

        return await self._run(operation, work, None, atomic=True, idem_key=idem_key)

    async def approval_request(
        self, idem_key: str, *, tx: object | None = None
    ) -> ApprovalRequest | None:
        params: dict[str, object] = {"idem_key": idem_key}
        return await self._read_one("approval_request", q.APPROVAL_GET, params, _request, tx)

    async def decide(self, request: DecideRequest) -> DecideOutcome:
        key = request.idem_key
        params = decide_params(self._dialect, request)
        audit = attempt_params(request.attempt, DecisionOutcome.ACCEPTED, DecisionCode.DECIDED)
        link = request.link
        started = self._counts.epoch

        async def work(cur: Cursor) -> tuple[Any, ...] | str | None:
            # The link's nonce first, as PostgreSQL does: a concurrent use of the same
            # link waits on its unique key and then finds it used (link_used on every
            # store), rather than waiting on the effect's row (already_decided).
            if link is not None:
                fresh = await insert_new(
                    cur,
                    q.LINK_INSERT,
                    {
                        "nonce": link.nonce,
                        "idem_key": key,
                        "action": link.action.value,
                        "used_by": request.attempt.principal,
                        "expires": stored(link.expires_at),
                    },
                )
                if not fresh:
                    return LINK_ALREADY_USED
            if await cur.execute(q.SETTLE, params) != 1:
                if link is not None:
                    await cur.execute(q.ROLLBACK)  # the nonce too: this use decided nothing
                return None
            await cur.execute(q.ATTEMPT_INSERT, audit)
            await cur.execute(q.FIND, {"idem_key": key})
            row: tuple[Any, ...] | None = await cur.fetchone()
            return row

        moved = await self._run("decide", work, None, atomic=True, idem_key=key)
        if moved is None:
            return DecideOutcome(None)
        if isinstance(moved, str):
            return DecideOutcome(None, link_used=True)
        self._changed(key, None)
        (row,) = await self._counted([moved], started, None)
        return DecideOutcome(self._effect_of_row(row))

    async def record_attempt(
        self, attempt: NewDecisionAttempt, *, outcome: DecisionOutcome, reason: DecisionCode
    ) -> None:
        params = attempt_params(attempt, outcome, reason)

        async def work(cur: Cursor) -> None:
            await cur.execute(q.ATTEMPT_INSERT, params)

        await self._run("record_attempt", work, None, atomic=False, idem_key=attempt.idem_key)

    async def decision_attempts(
        self, idem_key: str | None = None, *, limit: int = 1000, tx: object | None = None
    ) -> list[DecisionAttempt]:
        async def work(cur: Cursor) -> list[DecisionAttempt]:
            if idem_key is None:
                await cur.execute(q.ATTEMPTS_ALL, {"limit": limit})
            else:
                await cur.execute(q.ATTEMPTS_OF, {"idem_key": idem_key, "limit": limit})
            return [attempt_from_row(row, utc) for row in await cur.fetchall()]

        return await self._run("decision_attempts", work, tx, atomic=False)

    async def overdue_approvals(self, *, limit: int = 500) -> list[ApprovalRequest]:
        async def work(cur: Cursor) -> list[ApprovalRequest]:
            await cur.execute(q.APPROVALS_OVERDUE, {"limit": limit} | WAITING_PARAMS)
            return [request_from_row(row, utc) for row in await cur.fetchall()]

        return await self._run("overdue_approvals", work, None, atomic=False)

    async def escalations_due(self, *, fraction: float, limit: int = 500) -> list[ApprovalRequest]:
        async def work(cur: Cursor) -> list[ApprovalRequest]:
            params = {"fraction": fraction, "limit": limit} | WAITING_PARAMS
            await cur.execute(q.ESCALATIONS_DUE, params)
            return [request_from_row(row, utc) for row in await cur.fetchall()]

        return await self._run("escalations_due", work, None, atomic=False)

    async def mark_escalated(self, idem_key: str, *, created_at: datetime) -> bool:
        params = {"idem_key": idem_key, "created_at": stored(created_at)}

        async def work(cur: Cursor) -> bool:
            return bool(await cur.execute(q.ESCALATION_MARK, params) == 1)

        return await self._run("mark_escalated", work, None, atomic=False, idem_key=idem_key)
