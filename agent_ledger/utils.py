"""agent-ledger 0.2.x's ``agent_ledger.utils``, kept so that 0.2.x imports get guidance.

Nothing lives here: 0.2.x's helpers (RFC 8785 canonical JSON, its key, its
ids) resolve through ``agent_ledger.legacy.names.resolve_in``, to the current
function with a ``DeprecationWarning`` where one has the same meaning, else
to a ``RemovedNameError`` naming what to use instead.
"""

from __future__ import annotations

from agent_ledger.legacy.names import resolve_in


def __getattr__(name: str) -> object:
    return resolve_in(__name__, name)
