"""agent-ledger 0.2.x's ``agent_ledger.types``, kept so that 0.2.x imports get guidance.

Nothing lives here. Each 0.2.x name resolves through
``agent_ledger.legacy.names.resolve_in``: a name with the same meaning here
returns the current object and warns (``DeprecationWarning``) with the
top-level spelling (``from agent_ledger import Effect``); one without an
equivalent raises ``RemovedNameError`` saying what to use instead.
"""

from __future__ import annotations

from agent_ledger.legacy.names import resolve_in


def __getattr__(name: str) -> object:
    return resolve_in(__name__, name)
