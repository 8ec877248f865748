"""Tools: a function registered once with ``@ledger.tool(...)``, each call one effect.

This layer sits above :mod:`agent_ledger.core` and uses only its public
API: a tool call is a ``ToolCall`` plus a handler given to ``ledger.run()``.
``EffectLedger.tool``, ``.workflow`` and ``.llm``, in the facade above, are
thin doors into it.
"""

from __future__ import annotations

from agent_ledger.tools._budget import (
    DEFAULT_HOLD_TTL_MS,
    BudgetScope,
    active_budgets,
    budget_store,
)
from agent_ledger.tools._llm import LLMReply, LLMResult, Pricing, call_llm
from agent_ledger.tools._outcome import CallOutcome
from agent_ledger.tools._tool import EFFECT_PARAMETER, Tool, ToolDecorator, ToolLedger, define
from agent_ledger.tools._workflow import WorkflowScope, current_workflow, workflow_scope

__all__ = [
    "DEFAULT_HOLD_TTL_MS",
    "EFFECT_PARAMETER",
    "BudgetScope",
    "CallOutcome",
    "LLMReply",
    "LLMResult",
    "Pricing",
    "Tool",
    "ToolDecorator",
    "ToolLedger",
    "WorkflowScope",
    "active_budgets",
    "budget_store",
    "call_llm",
    "current_workflow",
    "define",
    "workflow_scope",
]
