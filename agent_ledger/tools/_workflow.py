"""Which workflow a tool call belongs to: a context variable, set by ``ledger.workflow(id)``."""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar, Token
from types import TracebackType

from agent_ledger.calls import ToolCall
from agent_ledger.tools._budget import BudgetScope, pop, push

# One variable for the process, created once at import (context variables are
# never collected). asyncio copies the context into every task it starts, so
# `asyncio.gather` children inherit the scope they were started in.
_CURRENT: ContextVar[str | None] = ContextVar("agent_ledger_workflow", default=None)
#: The scopes entered in this context, innermost last, with the token that
#: undoes each. Kept in the context too, so one scope object entered by two
#: tasks or threads at once undoes each entry in the context that made it.
_ENTERED: ContextVar[tuple[tuple[WorkflowScope, Token[str | None], object | None], ...]] = (
    ContextVar("agent_ledger_workflow_scopes", default=())
)


def current_workflow() -> str | None:
    """The workflow id of the innermost ``ledger.workflow(...)`` around this code, or None."""
    return _CURRENT.get()


def innermost_entry(entered: Sequence[tuple[object, ...]], block: object) -> int:
    """Where ``block``'s latest entry is in ``entered`` (a context's stack of
    entries, innermost last, each starting with the block); raise
    ``RuntimeError`` (changing nothing) unless it is the innermost one.

    Each entry undoes itself by restoring what was in place before it: a
    block left before one entered inside it would restore a state that
    still holds the inner one, and the inner one's exit would bring the
    outer block back after both ended. So a block must be left before the
    block around it, as ``with`` statements always are. Shared by workflow
    scopes and replays, whose stacks are kept apart.
    """
    for i in range(len(entered) - 1, -1, -1):
        if entered[i][0] is block:
            if i != len(entered) - 1:
                inner = ", ".join(repr(e[0]) for e in entered[i + 1 :])
                raise RuntimeError(
                    f"{block!r} was exited before {inner}, entered inside it: leave "
                    "blocks in the reverse order of entering them (as `with` and "
                    "contextlib.ExitStack do); nothing was changed"
                )
            return i
    raise RuntimeError(f"{block!r} was exited in a context that did not enter it")


class WorkflowScope:
    """``with`` / ``async with`` block whose tool calls belong to ``workflow_id``.

    Scopes nest (the innermost wins) and are seen by tasks started inside
    them (``asyncio.gather``, ``create_task``), not by tasks started before.
    The scope is the context's, not one ledger's: every ledger's tools called
    inside it use it.
    """

    __slots__ = ("budget", "workflow_id")

    def __init__(self, workflow_id: str, budget: BudgetScope | None = None) -> None:
        # The same checks a ToolCall makes, at the scope's start rather than
        # at the first call inside it.
        ToolCall(workflow_id=workflow_id, tool="-")
        self.workflow_id = workflow_id
        #: The spend budget the block's tool and model calls reserve on
        #: (``ledger.workflow(id, budget=...)``); inner scopes keep it too.
        self.budget = budget

    def __enter__(self) -> WorkflowScope:
        token = _CURRENT.set(self.workflow_id)
        budget_token = None if self.budget is None else push(self.budget)
        _ENTERED.set((*_ENTERED.get(), (self, token, budget_token)))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        entered = _ENTERED.get()
        i = self.check_innermost()
        _, token, budget_token = entered[i]
        _ENTERED.set(entered[:i])
        if budget_token is not None:
            pop(budget_token)
        _CURRENT.reset(token)

    def check_innermost(self) -> int:
        """Where this scope's latest entry is in this context's stack; raise
        ``RuntimeError`` (changing nothing) unless it is the innermost one
        (:func:`innermost_entry`)."""
        return innermost_entry(_ENTERED.get(), self)

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
        return f"WorkflowScope({self.workflow_id!r})"
