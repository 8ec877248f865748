"""PostgresStore's budgets (``BudgetStore``), kept apart from its effect steps.

A read is one statement in autocommit; a step that changes a budget is one
transaction that locks the budget row first, then runs its statement (two
for booking) in a fresh snapshot (``_postgres_queries``, BUDGET_LOCK, says
why); none is repeated after a lost reply (a repeated book would be harmless, a repeated
reserve would hold twice): the caller sees the error. Why each statement is
atomic and free of lock cycles is said beside it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, LiteralString

from psycopg import sql

from agent_ledger.budgets import Budget, BudgetState, Spend
from agent_ledger.stores import _postgres_queries as q
from agent_ledger.stores._postgres_tables import Connection, PostgresTables, utc
from agent_ledger.stores.budget_base import (
    DETACHED,
    NewHold,
    amount_params,
    budget_from_row,
    check_budget_limit,
    check_hold,
    estimate_params,
    limit_params,
)

BUDGETS_TABLE: Final = "agent_ledger_budgets"
HOLDS_TABLE: Final = "agent_ledger_budget_holds"
CHARGES_TABLE: Final = "agent_ledger_budget_charges"


def _budget(row: tuple[Any, ...]) -> BudgetState:
    return budget_from_row(row, utc)


class PostgresBudgets(PostgresTables):
    """Mixed into ``PostgresStore``: the budget tables of schema version 3."""

    @functools.cached_property
    def _budget_sql(self) -> dict[str, sql.Composed]:
        tables = {"budgets": BUDGETS_TABLE, "holds": HOLDS_TABLE, "charges": CHARGES_TABLE}
        texts: dict[str, LiteralString] = {
            "open": q.BUDGET_OPEN,
            "get": q.BUDGET_GET,
            "list": q.BUDGET_LIST,
            "reserve": q.BUDGET_RESERVE,
            "claim": q.CHARGE_CLAIM,
            "book": q.BUDGET_BOOK,
            "release": q.BUDGET_RELEASE,
            "detach": q.BUDGET_DETACH,
            "reclaim": q.BUDGET_RECLAIM,
            "lock": q.BUDGET_LOCK,
        }
        return self._composed(tables, texts)

    async def _budget_rows(
        self,
        operation: str,
        name: str,
        params: Mapping[str, object] | tuple[object, ...],
        *,
        idem_key: str | None = None,
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One statement, in autocommit (a read, or an insert-or-get)."""
        statement = self._budget_sql[name]

        async def fetch(conn: Connection) -> tuple[list[tuple[Any, ...]], int]:
            cursor = await conn.execute(statement, params)
            rows = await cursor.fetchall() if cursor.description is not None else []
            return rows, cursor.rowcount

        return await self._statement(operation, fetch, None, idem_key=idem_key)

    async def _locked(
        self,
        operation: str,
        names: tuple[str, ...],
        params: Mapping[str, object],
        *,
        idem_key: str | None = None,
    ) -> tuple[list[tuple[Any, ...]], int]:
        """A step that changes the budget: one transaction that locks the budget
        row (``BUDGET_LOCK``, why: beside it), then runs ``names`` in order, each
        in a fresh snapshot; the last one's rows and row count."""
        lock = self._budget_sql["lock"]
        statements = [self._budget_sql[name] for name in names]

        async def work(conn: Connection) -> tuple[list[tuple[Any, ...]], int]:
            async with conn.transaction():
                await conn.execute(lock, params)
                for statement in statements:
                    cursor = await conn.execute(statement, params)
                rows = await cursor.fetchall() if cursor.description is not None else []
            return rows, cursor.rowcount

        return await self._statement(operation, work, None, idem_key=idem_key)

    async def open_budget(self, workflow_id: str, limits: Budget) -> BudgetState:
        params = {"workflow_id": workflow_id, **limit_params(limits)}
        rows, _ = await self._budget_rows("open_budget", "open", params)
        return _budget(rows[0])

    async def reserve_budget(self, hold: NewHold) -> bool:
        check_hold(hold)
        params = {
            "hold_id": hold.hold_id,
            "workflow_id": hold.workflow_id,
            "idem_key": hold.idem_key,
            "ttl_ms": hold.ttl_ms,
            **amount_params("add", hold.estimate),
            **estimate_params(hold),
        }
        _, count = await self._locked(
            "reserve_budget", ("reserve",), params, idem_key=hold.idem_key
        )
        return count == 1

    async def book_charge(
        self,
        workflow_id: str,
        *,
        idem_key: str,
        charge: Spend,
        hold_id: str | None,
        finished_at: datetime | None = None,
    ) -> bool:
        params = {
            "workflow_id": workflow_id,
            "idem_key": idem_key,
            "hold_id": hold_id,
            "finished_at": finished_at,
            **amount_params("add", charge),
        }
        lock, claim, book = (self._budget_sql[n] for n in ("lock", "claim", "book"))

        async def work(conn: Connection) -> bool:
            # BUDGET_LOCK first (why: beside it); then each statement in a
            # fresh snapshot: BUDGET_BOOK sees the charge row CHARGE_CLAIM
            # made sure of, and every hold of the effect.
            async with conn.transaction():
                await conn.execute(lock, params)
                claimed = (await conn.execute(claim, params)).rowcount == 1
                rows = await (await conn.execute(book, params)).fetchall()
            return claimed or (bool(rows) and int(rows[0][0]) > 0)

        return await self._statement("book_charge", work, None, idem_key=idem_key)

    async def detach_hold(self, workflow_id: str, hold_id: str) -> bool:
        params = {"workflow_id": workflow_id, "hold_id": hold_id, "detached": DETACHED}
        rows, _ = await self._locked("detach_hold", ("detach",), params)
        return bool(rows)

    async def release_hold(self, workflow_id: str, hold_id: str) -> bool:
        params = {"workflow_id": workflow_id, "hold_id": hold_id}
        rows, _ = await self._locked("release_hold", ("release",), params)
        return bool(rows)

    async def reclaim_holds(self, workflow_id: str) -> int:
        rows, _ = await self._locked("reclaim_holds", ("reclaim",), {"workflow_id": workflow_id})
        return int(rows[0][0]) if rows else 0

    async def get_budget(self, workflow_id: str) -> BudgetState | None:
        rows, _ = await self._budget_rows("get_budget", "get", (workflow_id,))
        return _budget(rows[0]) if rows else None

    async def list_budgets(self, *, limit: int = 100) -> list[BudgetState]:
        check_budget_limit(limit)
        rows, _ = await self._budget_rows("list_budgets", "list", {"limit": limit})
        return [_budget(row) for row in rows]
