"""SqliteStore's budgets (``BudgetStore``), kept apart from its effect steps.

Every writing step runs in its own ``BEGIN IMMEDIATE`` transaction, like the
effect and saga steps, so its check and its writes see no other writer in
between, in this process or another. Statements are in ``_sqlite_queries``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

from agent_ledger.budgets import Budget, BudgetState, Spend
from agent_ledger.stores import _sqlite_queries as q
from agent_ledger.stores.budget_base import (
    NewHold,
    amount_params,
    budget_from_row,
    check_budget_limit,
    estimate_params,
    limit_params,
)

_T = TypeVar("_T")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _when(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _budget(row: tuple[Any, ...]) -> BudgetState:
    return budget_from_row(row, _when)


def _give_back(
    conn: sqlite3.Connection, sums: str, delete: str, params: dict[str, object], spent: Spend
) -> int:
    """Delete the holds ``sums``/``delete`` select and apply them, with ``spent``,
    to the budget row; how many holds there were."""
    count, *freed = conn.execute(sums, params).fetchone()
    if count == 0 and spent == Spend():
        return 0
    conn.execute(delete, params)
    conn.execute(
        q.BUDGET_APPLY,
        params | amount_params("spent", spent) | amount_params("freed", Spend(*freed)),
    )
    return int(count)


class SqliteBudgets:
    """Mixed into ``SqliteStore``: the budget tables of schema version 3."""

    if TYPE_CHECKING:

        async def _enter(self, tx: object | None) -> Any: ...

        async def _run(
            self,
            operation: str,
            work: Callable[[sqlite3.Connection, int], _T],
            tx: Any,
            *,
            write: bool,
            idem_key: str | None = None,
            effect_id: str | None = None,
        ) -> _T: ...

    async def open_budget(self, workflow_id: str, limits: Budget) -> BudgetState:
        await self._enter(None)
        params = {"workflow_id": workflow_id, **limit_params(limits)}

        def work(conn: sqlite3.Connection, now: int) -> BudgetState:
            conn.execute(q.BUDGET_INSERT, params | {"now": now})
            return _budget(conn.execute(q.BUDGET_GET, (workflow_id,)).fetchone())

        return await self._run("open_budget", work, None, write=True)

    async def reserve_budget(self, hold: NewHold) -> bool:
        await self._enter(None)
        params: dict[str, object] = {
            "hold_id": hold.hold_id,
            "workflow_id": hold.workflow_id,
            "idem_key": hold.idem_key,
            "ttl_ms": hold.ttl_ms,
            **amount_params("add", hold.estimate),
            **estimate_params(hold),
        }

        def work(conn: sqlite3.Connection, now: int) -> bool:
            at = params | {"now": now}
            # The effect's own earlier holds are its room: replaced, not added to.
            count, *freed = conn.execute(q.HOLDS_OF_KEY, at).fetchone()
            at |= amount_params("freed", Spend(*(int(v) for v in freed)))
            if conn.execute(q.BUDGET_RESERVE, at).rowcount != 1:
                return False
            if count:
                conn.execute(q.DELETE_HOLDS_OF_KEY, at)
            conn.execute(q.HOLD_INSERT, at)
            return True

        return await self._run("reserve_budget", work, None, write=True, idem_key=hold.idem_key)

    async def book_charge(
        self, workflow_id: str, *, idem_key: str, charge: Spend, hold_id: str | None
    ) -> bool:
        await self._enter(None)
        params: dict[str, object] = {
            "workflow_id": workflow_id,
            "idem_key": idem_key,
            "hold_id": hold_id,
            **amount_params("add", charge),
        }

        def work(conn: sqlite3.Connection, now: int) -> bool:
            at = params | {"now": now}
            row = conn.execute(q.CHARGE_GET, at).fetchone()
            if row is None:
                booked = conn.execute(q.CHARGE_INSERT, at).rowcount == 1
                added = charge if booked else Spend()
            else:
                before = Spend(*(int(v) for v in row))
                after = Spend(*(max(b, c) for b, c in zip(before, charge, strict=True)))
                added = Spend(*(a - b for a, b in zip(after, before, strict=True)))
                booked = added != Spend()
                if booked:
                    conn.execute(q.CHARGE_RAISE, at | amount_params("add", after))
            _give_back(conn, q.HOLDS_OF_EFFECT, q.DELETE_HOLDS_OF_EFFECT, at, added)
            return booked

        return await self._run("book_charge", work, None, write=True, idem_key=idem_key)

    async def release_hold(self, workflow_id: str, hold_id: str) -> bool:
        await self._enter(None)
        params: dict[str, object] = {"workflow_id": workflow_id, "hold_id": hold_id}

        def work(conn: sqlite3.Connection, now: int) -> bool:
            at = params | {"now": now}
            return _give_back(conn, q.HOLD_ONE, q.DELETE_HOLD_ONE, at, Spend()) > 0

        return await self._run("release_hold", work, None, write=True)

    async def reclaim_holds(self, workflow_id: str) -> int:
        await self._enter(None)
        params: dict[str, object] = {"workflow_id": workflow_id}

        def work(conn: sqlite3.Connection, now: int) -> int:
            at = params | {"now": now}
            return _give_back(conn, q.HOLDS_EXPIRED, q.DELETE_HOLDS_EXPIRED, at, Spend())

        return await self._run("reclaim_holds", work, None, write=True)

    async def get_budget(self, workflow_id: str) -> BudgetState | None:
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> BudgetState | None:
            row = conn.execute(q.BUDGET_GET, (workflow_id,)).fetchone()
            return None if row is None else _budget(row)

        return await self._run("get_budget", work, None, write=False)

    async def list_budgets(self, *, limit: int = 100) -> list[BudgetState]:
        check_budget_limit(limit)
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> list[BudgetState]:
            return [_budget(row) for row in conn.execute(q.BUDGET_LIST, {"limit": limit})]

        return await self._run("list_budgets", work, None, write=False)
