"""SqliteStore's budgets (``BudgetStore``), kept apart from its effect steps.

Every writing step runs in its own ``BEGIN IMMEDIATE`` transaction, like the
effect and saga steps, so its check and its writes see no other writer in
between, in this process or another. Statements are in ``_sqlite_queries``.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from agent_ledger.budgets import Budget, BudgetState, Spend
from agent_ledger.stores import _sqlite_queries as q
from agent_ledger.stores._sqlite_tables import SqliteTables, from_us, to_us
from agent_ledger.stores.budget_base import (
    DETACHED,
    NewHold,
    amount_params,
    budget_from_row,
    check_budget_limit,
    check_hold,
    detached_key,
    hold_amount,
    joined_room,
    largest_spend,
    limit_params,
    limit_values,
    room_freed,
    spend_minus,
)


def _budget(row: tuple[Any, ...]) -> BudgetState:
    return budget_from_row(row, from_us)


def _give_back(
    conn: sqlite3.Connection, which: str, params: dict[str, object], spent: Spend
) -> int:
    """Delete the holds ``which`` (a ``HOLD_ROWS`` condition) selects; take off
    ``reserved`` what each of their effects' room shrinks by (to the largest
    estimate among its holds left), add ``spent``; how many holds there were."""
    gone = {row[0]: row[1] for row in conn.execute(q.HOLD_ROWS + which, params)}
    if not gone and spent == Spend():
        return 0
    freed = Spend()
    for key in set(gone.values()):
        group = conn.execute(q.HOLD_ROWS + q.OF_KEY, params | {"idem_key": key}).fetchall()
        freed = Spend(*(f + d for f, d in zip(freed, room_freed(group, gone), strict=True)))
    for hold_id in gone:
        conn.execute(q.DELETE_HOLD_ONE, params | {"hold_id": hold_id})
    conn.execute(
        q.BUDGET_APPLY, params | amount_params("spent", spent) | amount_params("freed", freed)
    )
    return len(gone)


class SqliteBudgets(SqliteTables):
    """Mixed into ``SqliteStore``: the budget tables of schema version 3."""

    async def open_budget(self, workflow_id: str, limits: Budget) -> BudgetState:
        await self._enter(None)
        params = {"workflow_id": workflow_id, **limit_params(limits)}

        def work(conn: sqlite3.Connection, now: int) -> BudgetState:
            conn.execute(q.BUDGET_INSERT, params | {"now": now})
            return _budget(conn.execute(q.BUDGET_GET, (workflow_id,)).fetchone())

        return await self._run("open_budget", work, None, write=True)

    async def reserve_budget(self, hold: NewHold) -> bool:
        check_hold(hold)
        await self._enter(None)
        params: dict[str, object] = {
            "hold_id": hold.hold_id,
            "workflow_id": hold.workflow_id,
            "idem_key": hold.idem_key,
            "ttl_ms": hold.ttl_ms,
            **amount_params("add", hold.estimate),
        }

        def work(conn: sqlite3.Connection, now: int) -> bool:
            at = params | {"now": now}
            row = conn.execute(q.BUDGET_GET, (hold.workflow_id,)).fetchone()
            if row is None:
                return False
            state = _budget(row)
            # The effect's room is the largest estimate among its live holds
            # (its callers share it); its expired ones (a dead worker's) are
            # dropped. Inside BEGIN IMMEDIATE nobody else changes them meanwhile.
            group = conn.execute(q.HOLD_ROWS + q.OF_KEY, at).fetchall()
            dead = [g[0] for g in group if int(g[6]) <= now]
            old = largest_spend(hold_amount(g) for g in group)
            live = [hold_amount(g) for g in group if g[0] not in dead]
            new = joined_room(limit_values(state), state.spent, state.reserved, old, live, hold)
            if new is None:
                return False
            for hold_id in dead:
                conn.execute(q.DELETE_HOLD_ONE, at | {"hold_id": hold_id})
            conn.execute(
                q.BUDGET_APPLY,
                at
                | amount_params("spent", Spend())
                | amount_params("freed", spend_minus(old, new)),
            )
            conn.execute(q.HOLD_INSERT, at)
            return True

        return await self._run("reserve_budget", work, None, write=True, idem_key=hold.idem_key)

    async def book_charge(
        self,
        workflow_id: str,
        *,
        idem_key: str,
        charge: Spend,
        hold_id: str | None,
        finished_at: datetime | None = None,
    ) -> bool:
        await self._enter(None)
        params: dict[str, object] = {
            "workflow_id": workflow_id,
            "idem_key": idem_key,
            "hold_id": hold_id,
            "finished_us": None if finished_at is None else to_us(finished_at),
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
            _give_back(conn, q.OF_EFFECT, at, added)
            return booked

        return await self._run("book_charge", work, None, write=True, idem_key=idem_key)

    async def detach_hold(self, workflow_id: str, hold_id: str) -> bool:
        await self._enter(None)
        params: dict[str, object] = {"workflow_id": workflow_id, "hold_id": hold_id}

        def work(conn: sqlite3.Connection, now: int) -> bool:
            at = params | {"now": now}
            row = conn.execute(q.HOLD_ROWS + q.ONE_HOLD, at).fetchone()
            if row is None or DETACHED in row[1]:
                return False
            # Out of the effect's room (it shrinks to the largest estimate left),
            # into its own: reserved grows by the hold's estimate.
            group = conn.execute(q.HOLD_ROWS + q.OF_KEY, at | {"idem_key": row[1]}).fetchall()
            conn.execute(q.HOLD_REKEY, at | {"new_key": detached_key(row[1], hold_id)})
            conn.execute(
                q.BUDGET_APPLY,
                at
                | amount_params("spent", Spend())
                | amount_params(
                    "freed", spend_minus(room_freed(group, {hold_id}), hold_amount(row))
                ),
            )
            return True

        return await self._run("detach_hold", work, None, write=True)

    async def release_hold(self, workflow_id: str, hold_id: str) -> bool:
        await self._enter(None)
        params: dict[str, object] = {"workflow_id": workflow_id, "hold_id": hold_id}

        def work(conn: sqlite3.Connection, now: int) -> bool:
            at = params | {"now": now}
            return _give_back(conn, q.ONE_HOLD, at, Spend()) > 0

        return await self._run("release_hold", work, None, write=True)

    async def reclaim_holds(self, workflow_id: str) -> int:
        await self._enter(None)
        params: dict[str, object] = {"workflow_id": workflow_id}

        def work(conn: sqlite3.Connection, now: int) -> int:
            at = params | {"now": now}
            return _give_back(conn, q.EXPIRED, at, Spend())

        return await self._run("reclaim_holds", work, None, write=True)

    async def get_budget(self, workflow_id: str) -> BudgetState | None:
        return await self._read_one("get_budget", q.BUDGET_GET, (workflow_id,), _budget)

    async def list_budgets(self, *, limit: int = 100) -> list[BudgetState]:
        check_budget_limit(limit)
        await self._enter(None)

        def work(conn: sqlite3.Connection, now: int) -> list[BudgetState]:
            return [_budget(row) for row in conn.execute(q.BUDGET_LIST, {"limit": limit})]

        return await self._run("list_budgets", work, None, write=False)
