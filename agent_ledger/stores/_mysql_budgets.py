"""MySQLStore's budgets (``BudgetStore``), kept apart from its effect steps.

Every step that changes holds or a budget row is one transaction that first
locks the budget row (``BUDGET_LOCK``, which also reads the database's clock
once for the step). So the steps of one budget run one after another, each
sees every hold the others made, and the room each effect takes (the
largest estimate among its holds) is worked out here, in Python, exactly as
SqliteStore does under its write lock. Statements are in ``_mysql_queries``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from agent_ledger.budgets import Budget, BudgetState, Spend
from agent_ledger.stores import _mysql_queries as q
from agent_ledger.stores._mysql_tables import Cursor, MySQLTables, insert_new, stored, utc
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

_T = TypeVar("_T")


def _budget(row: tuple[Any, ...]) -> BudgetState:
    return budget_from_row(row, utc)


async def _rows(cur: Cursor, statement: str, params: dict[str, object]) -> list[tuple[Any, ...]]:
    await cur.execute(statement, params)
    return list(await cur.fetchall())


async def _lock(cur: Cursor, workflow_id: str) -> datetime | None:
    """Lock the budget row for the rest of the transaction; the database's time now,
    or None when there is no such budget."""
    await cur.execute(q.BUDGET_LOCK, {"workflow_id": workflow_id})
    row = await cur.fetchone()
    return None if row is None else row[1]


async def _give_back(cur: Cursor, which: str, params: dict[str, object], spent: Spend) -> int:
    """Delete the holds ``which`` (a ``HOLD_ROWS`` condition) selects; take off
    ``reserved`` what each of their effects' room shrinks by (to the largest
    estimate among its holds left), add ``spent``; how many holds there were."""
    gone = {row[0]: row[1] for row in await _rows(cur, q.HOLD_ROWS + which, params)}
    if not gone and spent == Spend():
        return 0
    freed = Spend()
    for key in set(gone.values()):
        group = await _rows(cur, q.HOLD_ROWS + q.OF_KEY, params | {"idem_key": key})
        freed = Spend(*(f + d for f, d in zip(freed, room_freed(group, gone), strict=True)))
    for hold_id in gone:
        await cur.execute(q.DELETE_HOLD_ONE, params | {"hold_id": hold_id})
    await cur.execute(
        q.BUDGET_APPLY, params | amount_params("spent", spent) | amount_params("freed", freed)
    )
    return len(gone)


class MySQLBudgets(MySQLTables):
    """Mixed into ``MySQLStore``: the budget tables."""

    async def _on_budget(
        self,
        operation: str,
        params: dict[str, object],
        step: Callable[[Cursor, dict[str, object]], Awaitable[_T]],
        missing: _T,
        *,
        idem_key: str | None = None,
    ) -> _T:
        """One transaction: lock the budget row of ``params["workflow_id"]``
        (``_lock``), then ``step`` with ``params`` and the database's time now
        (``"now"``); ``missing`` when there is no such budget."""

        async def work(cur: Cursor) -> _T:
            now = await _lock(cur, str(params["workflow_id"]))
            if now is None:
                return missing
            return await step(cur, params | {"now": now})

        return await self._run(operation, work, None, atomic=True, idem_key=idem_key)

    async def open_budget(self, workflow_id: str, limits: Budget) -> BudgetState:
        params: dict[str, object] = {"workflow_id": workflow_id, **limit_params(limits)}

        async def work(cur: Cursor) -> BudgetState:
            await insert_new(cur, q.BUDGET_INSERT, params)
            await cur.execute(q.BUDGET_GET, params)
            return _budget(await cur.fetchone())

        return await self._run("open_budget", work, None, atomic=True)

    async def reserve_budget(self, hold: NewHold) -> bool:
        check_hold(hold)
        params: dict[str, object] = {
            "hold_id": hold.hold_id,
            "workflow_id": hold.workflow_id,
            "idem_key": hold.idem_key,
            "ttl_ms": hold.ttl_ms,
            **amount_params("add", hold.estimate),
        }

        async def step(cur: Cursor, at: dict[str, object]) -> bool:
            await cur.execute(q.BUDGET_GET, at)
            state = _budget(await cur.fetchone())
            # The effect's room is the largest estimate among its live holds
            # (its callers share it); its expired ones (a dead worker's) are
            # dropped. With the budget row locked nobody else changes them.
            group = await _rows(cur, q.HOLD_ROWS + q.OF_KEY, at)
            dead = [g[0] for g in group if g[6] <= at["now"]]
            old = largest_spend(hold_amount(g) for g in group)
            live = [hold_amount(g) for g in group if g[0] not in dead]
            new = joined_room(limit_values(state), state.spent, state.reserved, old, live, hold)
            if new is None:
                return False
            for hold_id in dead:
                await cur.execute(q.DELETE_HOLD_ONE, at | {"hold_id": hold_id})
            await cur.execute(
                q.BUDGET_APPLY,
                at
                | amount_params("spent", Spend())
                | amount_params("freed", spend_minus(old, new)),
            )
            await cur.execute(q.HOLD_INSERT, at)
            return True

        return await self._on_budget("reserve_budget", params, step, False, idem_key=hold.idem_key)

    async def book_charge(
        self,
        workflow_id: str,
        *,
        idem_key: str,
        charge: Spend,
        hold_id: str | None,
        finished_at: datetime | None = None,
    ) -> bool:
        params: dict[str, object] = {
            "workflow_id": workflow_id,
            "idem_key": idem_key,
            "hold_id": hold_id,
            "finished_at": None if finished_at is None else stored(finished_at),
            **amount_params("add", charge),
        }

        async def step(cur: Cursor, at: dict[str, object]) -> bool:
            await cur.execute(q.CHARGE_GET, at)
            row = await cur.fetchone()
            if row is None:
                booked = await insert_new(cur, q.CHARGE_INSERT, at)
                added = charge if booked else Spend()
            else:
                before = Spend(*(int(v) for v in row))
                after = Spend(*(max(b, c) for b, c in zip(before, charge, strict=True)))
                added = Spend(*(a - b for a, b in zip(after, before, strict=True)))
                booked = added != Spend()
                if booked:
                    await cur.execute(q.CHARGE_RAISE, at | amount_params("add", after))
            await _give_back(cur, q.OF_EFFECT, at, added)
            return booked

        return await self._on_budget("book_charge", params, step, False, idem_key=idem_key)

    async def detach_hold(self, workflow_id: str, hold_id: str) -> bool:
        params: dict[str, object] = {"workflow_id": workflow_id, "hold_id": hold_id}

        async def step(cur: Cursor, at: dict[str, object]) -> bool:
            await cur.execute(q.HOLD_ROWS + q.ONE_HOLD, at)
            row = await cur.fetchone()
            if row is None or DETACHED in row[1]:
                return False
            # Out of the effect's room (it shrinks to the largest estimate left),
            # into its own: reserved grows by the hold's estimate.
            group = await _rows(cur, q.HOLD_ROWS + q.OF_KEY, at | {"idem_key": row[1]})
            await cur.execute(q.HOLD_REKEY, at | {"new_key": detached_key(row[1], hold_id)})
            await cur.execute(
                q.BUDGET_APPLY,
                at
                | amount_params("spent", Spend())
                | amount_params(
                    "freed", spend_minus(room_freed(group, {hold_id}), hold_amount(row))
                ),
            )
            return True

        return await self._on_budget("detach_hold", params, step, False)

    async def release_hold(self, workflow_id: str, hold_id: str) -> bool:
        params: dict[str, object] = {"workflow_id": workflow_id, "hold_id": hold_id}

        async def step(cur: Cursor, at: dict[str, object]) -> bool:
            return await _give_back(cur, q.ONE_HOLD, at, Spend()) > 0

        return await self._on_budget("release_hold", params, step, False)

    async def reclaim_holds(self, workflow_id: str) -> int:
        params: dict[str, object] = {"workflow_id": workflow_id}

        async def step(cur: Cursor, at: dict[str, object]) -> int:
            return await _give_back(cur, q.EXPIRED, at, Spend())

        return await self._on_budget("reclaim_holds", params, step, 0)

    async def get_budget(self, workflow_id: str) -> BudgetState | None:
        params: dict[str, object] = {"workflow_id": workflow_id}
        return await self._read_one("get_budget", q.BUDGET_GET, params, _budget)

    async def list_budgets(self, *, limit: int = 100) -> list[BudgetState]:
        check_budget_limit(limit)

        async def work(cur: Cursor) -> list[BudgetState]:
            await cur.execute(q.BUDGET_LIST, {"limit": limit})
            return [_budget(row) for row in await cur.fetchall()]

        return await self._run("list_budgets", work, None, atomic=False)
