"""agent-ledger: make AI agents' side effects run once, leave a receipt, and wait for approval.

Start with :class:`EffectLedger` and ``await ledger.run(call, handler)``.

``__all__`` is what an application uses; everything else is imported from
the module it lives in (``agent_ledger.effects``, ``agent_ledger.errors``,
``agent_ledger.options``...). Names that used to be here still resolve, with
a ``DeprecationWarning`` naming their home (:data:`MOVED`).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Final

from agent_ledger._version import __version__
from agent_ledger.budgets import Budget
from agent_ledger.calls import ToolCall
from agent_ledger.effects import Effect, EffectError, JSONValue, Usage
from agent_ledger.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerError,
    EffectLedgerValidationError,
    EffectStoreError,
    RetryableToolError,
)
from agent_ledger.ledger import EffectLedger
from agent_ledger.options import EffectLedgerOptions, LedgerDefaults, LedgerHooks, RunOptions
from agent_ledger.retries import RetryPolicy
from agent_ledger.sagas import Saga, SagaFailed
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import Store
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.stores.url import open_store
from agent_ledger.tools import LLMResult, Tool

__all__ = [
    "ApprovalPendingError",
    "Budget",
    "BudgetExceededError",
    "Effect",
    "EffectDeniedError",
    "EffectError",
    "EffectFailedError",
    "EffectLedger",
    "EffectLedgerError",
    "EffectLedgerOptions",
    "EffectLedgerValidationError",
    "EffectStatus",
    "EffectStoreError",
    "JSONValue",
    "LLMResult",
    "LedgerDefaults",
    "LedgerHooks",
    "MemoryStore",
    "RetryPolicy",
    "RetryableToolError",
    "RunOptions",
    "Saga",
    "SagaFailed",
    "SqliteStore",
    "Store",
    "Tool",
    "ToolCall",
    "Usage",
    "__version__",
    "open_store",
]

#: Names this package exported before 0.4 that now live only in their module:
#: name -> module. They still resolve here, with a DeprecationWarning.
MOVED: Final[dict[str, str]] = {
    "UNSET": "agent_ledger.options",
    "ConcurrencyOptions": "agent_ledger.options",
    "StaleOptions": "agent_ledger.options",
    "BeginResult": "agent_ledger.effects",
    "CommitFailed": "agent_ledger.effects",
    "CommitSucceeded": "agent_ledger.effects",
    "FailedWithUsage": "agent_ledger.effects",
    "Parked": "agent_ledger.effects",
    "Reopening": "agent_ledger.effects",
    "Settlement": "agent_ledger.effects",
    "TryFailure": "agent_ledger.effects",
    "WithUsage": "agent_ledger.effects",
    "BudgetMismatchError": "agent_ledger.errors",
    "EffectInFlightError": "agent_ledger.errors",
    "EffectLedgerInvariantError": "agent_ledger.errors",
    "EffectPayloadMismatchError": "agent_ledger.errors",
    "EffectTimeoutError": "agent_ledger.errors",
    "HandlerTimeoutError": "agent_ledger.errors",
    "UnrecordedEffectError": "agent_ledger.errors",
    "BudgetState": "agent_ledger.budgets",
    "Spend": "agent_ledger.budgets",
    "EffectPage": "agent_ledger.audit",
    "LLMReply": "agent_ledger.tools",
    "LedgerStats": "agent_ledger.stores.base",
    "SchemaMigration": "agent_ledger.stores.base",
    "ManualClock": "agent_ledger.clock",
    "NonRetryableError": "agent_ledger.retries",
    "ResourceDescriptor": "agent_ledger.calls",
}


def __getattr__(name: str) -> object:
    """A name moved to its module (warns, naming its home); else 0.2.x's names:
    deprecated aliases, or an error saying what replaced them."""
    home = MOVED.get(name)
    if home is not None:
        warnings.warn(
            f"agent_ledger.{name} moved: import it from {home} "
            f"(`from {home} import {name}`); the top-level name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    from agent_ledger.legacy.names import resolve

    return resolve(name)
