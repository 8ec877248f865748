"""agent-ledger: make AI agents' side effects run once, leave a receipt, and wait for approval.

Start with :class:`EffectLedger` and ``await ledger.run(call, handler)``.
"""

from __future__ import annotations

from agent_ledger._version import __version__
from agent_ledger.audit import EffectPage
from agent_ledger.budgets import Budget, BudgetState, Spend
from agent_ledger.calls import ResourceDescriptor, ToolCall
from agent_ledger.clock import ManualClock
from agent_ledger.effects import (
    BeginResult,
    CommitFailed,
    CommitSucceeded,
    Effect,
    EffectError,
    FailedWithUsage,
    JSONValue,
    Parked,
    Reopening,
    Settlement,
    TryFailure,
    Usage,
    WithUsage,
)
from agent_ledger.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    BudgetMismatchError,
    EffectDeniedError,
    EffectFailedError,
    EffectInFlightError,
    EffectLedgerError,
    EffectLedgerInvariantError,
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    EffectStoreError,
    EffectTimeoutError,
    HandlerTimeoutError,
    UnrecordedEffectError,
)
from agent_ledger.ledger import EffectLedger
from agent_ledger.options import (
    UNSET,
    ConcurrencyOptions,
    EffectLedgerOptions,
    LedgerDefaults,
    LedgerHooks,
    RunOptions,
    StaleOptions,
)
from agent_ledger.retries import NonRetryableError, RetryPolicy
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import LedgerStats, SchemaMigration, Store
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.stores.url import open_store
from agent_ledger.tools import LLMReply, LLMResult

__all__ = [
    "UNSET",
    "ApprovalPendingError",
    "BeginResult",
    "Budget",
    "BudgetExceededError",
    "BudgetMismatchError",
    "BudgetState",
    "CommitFailed",
    "CommitSucceeded",
    "ConcurrencyOptions",
    "Effect",
    "EffectDeniedError",
    "EffectError",
    "EffectFailedError",
    "EffectInFlightError",
    "EffectLedger",
    "EffectLedgerError",
    "EffectLedgerInvariantError",
    "EffectLedgerOptions",
    "EffectLedgerValidationError",
    "EffectPage",
    "EffectPayloadMismatchError",
    "EffectStatus",
    "EffectStoreError",
    "EffectTimeoutError",
    "FailedWithUsage",
    "HandlerTimeoutError",
    "JSONValue",
    "LLMReply",
    "LLMResult",
    "LedgerDefaults",
    "LedgerHooks",
    "LedgerStats",
    "ManualClock",
    "MemoryStore",
    "NonRetryableError",
    "Parked",
    "Reopening",
    "ResourceDescriptor",
    "RetryPolicy",
    "RunOptions",
    "SchemaMigration",
    "Settlement",
    "Spend",
    "SqliteStore",
    "StaleOptions",
    "Store",
    "ToolCall",
    "TryFailure",
    "UnrecordedEffectError",
    "Usage",
    "WithUsage",
    "__version__",
    "open_store",
]


def __getattr__(name: str) -> object:
    """0.2.x's names: deprecated aliases, or an error saying what replaced them."""
    from agent_ledger.legacy.names import resolve

    return resolve(name)
