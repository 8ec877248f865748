"""MemoryStore's budgets (``BudgetStore``): the in-process twin of the budget tables.

Each step is synchronous inside one event loop (no await between its check
and its write), so it is atomic without a lock, as the effect steps are.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from agent_ledger.budgets import Budget, BudgetState, Spend
from agent_ledger.stores.budget_base import NewHold, check_budget_limit, fits

if TYPE_CHECKING:
    from agent_ledger.clock import Clock


@dataclasses.dataclass
class _Hold:
    idem_key: str
    estimate: Spend
    expires_at: datetime


@dataclasses.dataclass
class _Budget:
    limits: Budget
    spent: Spend
    reserved: Spend
    created_at: datetime
    updated_at: datetime
    holds: dict[str, _Hold] = dataclasses.field(default_factory=dict)
    #: What was booked for each effect (idem key): a later receipt adds only
    #: what it has above this, unit by unit.
    charged: dict[str, Spend] = dataclasses.field(default_factory=dict)


def _plus(a: Spend, b: Spend) -> Spend:
    return Spend(*(x + y for x, y in zip(a, b, strict=True)))


def _minus(a: Spend, b: Spend) -> Spend:
    return Spend(*(x - y for x, y in zip(a, b, strict=True)))


def _most(a: Spend, b: Spend) -> Spend:
    return Spend(*(max(x, y) for x, y in zip(a, b, strict=True)))


class MemoryBudgets:
    """Mixed into ``MemoryStore``: budgets, kept until the process exits."""

    if TYPE_CHECKING:
        _clock: Clock

    def _init_budgets(self) -> None:
        self._budgets: dict[str, _Budget] = {}

    def _state(self, workflow_id: str, budget: _Budget) -> BudgetState:
        return BudgetState(
            workflow_id=workflow_id,
            limits=budget.limits,
            spent=budget.spent,
            reserved=budget.reserved,
            holds=len(budget.holds),
            created_at=budget.created_at,
            updated_at=budget.updated_at,
        )

    async def open_budget(self, workflow_id: str, limits: Budget) -> BudgetState:
        budget = self._budgets.get(workflow_id)
        if budget is None:
            now = self._clock()
            budget = _Budget(limits, Spend(), Spend(), now, now)
            self._budgets[workflow_id] = budget
        return self._state(workflow_id, budget)

    async def reserve_budget(self, hold: NewHold) -> bool:
        budget = self._budgets.get(hold.workflow_id)
        if budget is None:
            return False
        limits = budget.limits
        limit_values = (
            limits.usd_micros,
            limits.input_tokens,
            limits.output_tokens,
            limits.tool_calls,
        )
        estimate = [
            amount if unit in hold.units else None
            for unit, amount in zip(Spend._fields, hold.estimate, strict=True)
        ]
        # The effect's own earlier holds are its room: replaced, not added to.
        replaced = [h for h, held in budget.holds.items() if held.idem_key == hold.idem_key]
        freed = Spend()
        for hold_id in replaced:
            freed = _plus(freed, budget.holds[hold_id].estimate)
        reserved = _minus(budget.reserved, freed)
        if not fits(limit_values, budget.spent, reserved, estimate):
            return False
        now = self._clock()
        self._drop(budget, replaced)
        budget.reserved = _plus(budget.reserved, hold.estimate)
        budget.holds[hold.hold_id] = _Hold(
            hold.idem_key, hold.estimate, now + timedelta(milliseconds=hold.ttl_ms)
        )
        budget.updated_at = now
        return True

    def _drop(self, budget: _Budget, hold_ids: list[str]) -> None:
        for hold_id in hold_ids:
            gone = budget.holds.pop(hold_id)
            budget.reserved = _minus(budget.reserved, gone.estimate)

    async def book_charge(
        self, workflow_id: str, *, idem_key: str, charge: Spend, hold_id: str | None
    ) -> bool:
        budget = self._budgets.get(workflow_id)
        if budget is None:
            return False
        self._drop(
            budget,
            [h for h, held in budget.holds.items() if h == hold_id or held.idem_key == idem_key],
        )
        before = budget.charged.get(idem_key)
        after = charge if before is None else _most(before, charge)
        added = after if before is None else _minus(after, before)
        budget.charged[idem_key] = after
        budget.spent = _plus(budget.spent, added)
        budget.updated_at = self._clock()
        return before is None or added != Spend()

    async def release_hold(self, workflow_id: str, hold_id: str) -> bool:
        budget = self._budgets.get(workflow_id)
        if budget is None or hold_id not in budget.holds:
            return False
        self._drop(budget, [hold_id])
        budget.updated_at = self._clock()
        return True

    async def reclaim_holds(self, workflow_id: str) -> int:
        budget = self._budgets.get(workflow_id)
        if budget is None:
            return 0
        now = self._clock()
        expired = [h for h, held in budget.holds.items() if held.expires_at <= now]
        if expired:
            self._drop(budget, expired)
            budget.updated_at = now
        return len(expired)

    async def get_budget(self, workflow_id: str) -> BudgetState | None:
        budget = self._budgets.get(workflow_id)
        return None if budget is None else self._state(workflow_id, budget)

    async def list_budgets(self, *, limit: int = 100) -> list[BudgetState]:
        check_budget_limit(limit)
        states = [self._state(w, b) for w, b in self._budgets.items()]
        states.sort(key=lambda s: (s.updated_at, s.workflow_id), reverse=True)
        return states[:limit]
