"""Which workflow a tool call belongs to: ``ledger.workflow(id)``, a block kept in the context.

The workflow id and the scopes entered are ambient state
(:mod:`agent_ledger.context`): asyncio copies them into every task started
inside the block, so ``asyncio.gather`` children inherit the scope they were
started in.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from agent_ledger.calls import ToolCall
from agent_ledger.context import (
    check_workflow_exit,
    current_workflow,
    enter_workflow,
    exit_workflow,
    innermost_entry,
)
from agent_ledger.tools._budget import BudgetScope

if TYPE_CHECKING:
    from agent_ledger.budgets import Budget
    from agent_ledger.core import LedgerCore

__all__ = ["WorkflowScope", "current_workflow", "innermost_entry", "workflow_scope"]


def workflow_scope(
    ledger: LedgerCore[object],
    workflow_id: str,
    budget: Budget | None = None,
    turn: str | None = None,
) -> WorkflowScope:
    """``ledger.workflow(workflow_id, budget=..., turn=...)``: the scope, with ``budget``
    (stored under ``workflow_id`` for ``ledger``) or else the budget stored there,
    if any, and ``turn``."""
    scope = WorkflowScope(workflow_id, turn=turn)  # checks the ids before the budget
    if budget is None:
        # The budget stored under this id, if any, still applies (read once,
        # on entering): another worker's limit is this one's too.
        scope.budget = BudgetScope.stored(ledger, workflow_id)
    else:
        scope.budget = BudgetScope(ledger, workflow_id, budget)
    return scope


class WorkflowScope:
    """``with`` / ``async with`` block whose tool calls belong to ``workflow_id``.

    Scopes nest (the innermost wins) and are seen by tasks started inside
    them (``asyncio.gather``, ``create_task``), not by tasks started before.
    The scope is the context's, not one ledger's: every ledger's tools called
    inside it use it.
    """

    __slots__ = ("budget", "turn", "workflow_id")

    def __init__(
        self, workflow_id: str, budget: BudgetScope | None = None, *, turn: str | None = None
    ) -> None:
        # The same checks a ToolCall makes, at the scope's start rather than
        # at the first call inside it.
        ToolCall(workflow_id=workflow_id, tool="-", turn=turn)
        self.workflow_id = workflow_id
        #: The turn of the workflow the block is (``ledger.workflow(id, turn=...)``).
        self.turn = turn
        #: The spend budget the block's tool and model calls reserve on
        #: (``ledger.workflow(id, budget=...)``); inner scopes keep it too.
        self.budget = budget

    def __enter__(self) -> WorkflowScope:
        enter_workflow(self, self.workflow_id, self.budget, self.turn)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        exit_workflow(self)

    def check_innermost(self) -> int:
        """Where this scope's latest entry is in this context's stack; raise
        ``RuntimeError`` (changing nothing) unless it is the innermost one
        (:func:`innermost_entry`)."""
        return check_workflow_exit(self)

    async def __aenter__(self) -> WorkflowScope:
        if self.budget is not None:
            # Stored (or checked) now, so a mismatch fails before the block runs.
            await self.budget.open()
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        if self.turn is not None:
            return f"WorkflowScope({self.workflow_id!r}, turn={self.turn!r})"
        return f"WorkflowScope({self.workflow_id!r})"
