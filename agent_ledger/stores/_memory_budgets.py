"""MemoryStore's budgets (``BudgetStore``): the in-process twin of the budget tables.

Each step is synchronous inside one event loop (no await between its check
and its write), so it is atomic without a lock, as the effect steps are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from agent_ledger.budgets import Budget, BudgetState, Spend
from agent_ledger.clock import utc_now
from agent_ledger.stores.budget_base import (
    DETACHED,
    NewHold,
    check_budget_limit,
    check_hold,
    detached_key,
    joined_room,
    largest_spend,
    spend_minus,
)

if TYPE_CHECKING:
    from agent_ledger.clock import Clock


@dataclasses.dataclass
class _Hold:
    idem_key: str
    estimate: Spend
    expires_at: datetime
    #: When it was made (the store's clock): a booking releases the other
    #: holds of its effect made strictly before the booked run finished.
    created_at: datetime


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


def _largest(holds: Iterable[_Hold]) -> Spend:
    """The room a group of holds of one effect takes (``largest_spend`` of their estimates)."""
    return largest_spend(held.estimate for held in holds)


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
            holds=len({held.idem_key for held in budget.holds.values()}),
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
        check_hold(hold)
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
        # Everything is worked out before anything changes: a step that fails
        # half-way must leave the budget as it was.
        now = self._clock()
        expires_at = now + timedelta(milliseconds=hold.ttl_ms)
        # The effect's room is the largest estimate among its live holds (its
        # callers share it); its expired ones (a dead worker's) are dropped.
        group = {h: held for h, held in budget.holds.items() if held.idem_key == hold.idem_key}
        dead = [h for h, held in group.items() if held.expires_at <= now]
        old = _largest(group.values())
        live = [held.estimate for h, held in group.items() if h not in dead]
        new = joined_room(limit_values, budget.spent, budget.reserved, old, live, hold)
        if new is None:
            return False
        for hold_id in dead:
            del budget.holds[hold_id]
        budget.reserved = _plus(spend_minus(budget.reserved, old), new)
        budget.holds[hold.hold_id] = _Hold(hold.idem_key, hold.estimate, expires_at, now)
        budget.updated_at = now
        return True

    def _drop(self, budget: _Budget, hold_ids: list[str]) -> None:
        """Delete the holds; each effect's room shrinks to the largest estimate
        among its holds that are left (nothing when none is)."""
        keys = {budget.holds[h].idem_key for h in hold_ids}
        before = {k: _largest(v for v in budget.holds.values() if v.idem_key == k) for k in keys}
        for hold_id in hold_ids:
            del budget.holds[hold_id]
        for key, old in before.items():
            left = _largest(v for v in budget.holds.values() if v.idem_key == key)
            budget.reserved = spend_minus(budget.reserved, spend_minus(old, left))

    async def book_charge(
        self,
        workflow_id: str,
        *,
        idem_key: str,
        charge: Spend,
        hold_id: str | None,
        finished_at: datetime | None = None,
    ) -> bool:
        budget = self._budgets.get(workflow_id)
        if budget is None:
            return False
        # The caller's hold, and the effect's holds made before the booked run
        # finished: a hold made at that instant or later (a rerun's, after a
        # reopen) keeps its room.
        self._drop(
            budget,
            [
                h
                for h, held in budget.holds.items()
                if h == hold_id
                or (
                    held.idem_key == idem_key
                    and finished_at is not None
                    and held.created_at < finished_at
                )
            ],
        )
        before = budget.charged.get(idem_key)
        after = charge if before is None else largest_spend([before, charge])
        added = after if before is None else spend_minus(after, before)
        budget.charged[idem_key] = after
        budget.spent = _plus(budget.spent, added)
        budget.updated_at = self._clock()
        return before is None or added != Spend()

    async def detach_hold(self, workflow_id: str, hold_id: str) -> bool:
        budget = self._budgets.get(workflow_id)
        if budget is None:
            return False
        held = budget.holds.get(hold_id)
        if held is None or DETACHED in held.idem_key:
            return False
        # Out of the effect's room (it shrinks to the largest estimate left),
        # into its own: reserved grows by the hold's estimate.
        self._drop(budget, [hold_id])
        budget.holds[hold_id] = dataclasses.replace(
            held, idem_key=detached_key(held.idem_key, hold_id)
        )
        budget.reserved = _plus(budget.reserved, held.estimate)
        budget.updated_at = self._clock()
        return True

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


class InMemoryBudgets(MemoryBudgets):
    """Budgets alone, in memory, on the system clock: what ``ledger.replay()``
    simulates the replayed code's budgets with (nothing stored, no effect
    store needed beside them)."""

    def __init__(self) -> None:
        self._clock = utc_now
        self._init_budgets()
