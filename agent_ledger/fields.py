"""The effect's fields, listed once.

:data:`EFFECT_FIELDS` names every field of :class:`~agent_ledger.effects.Effect`
in declaration order; a test holds the two equal, so adding a field to
``Effect`` without adding it here fails loudly. Everything else that lists
the fields derives from this tuple: the stores' rows and SQL select lists
(``stores/_columns.py``) and the export format (``receipt.RECORD_FIELDS``).

A value module: it imports nothing from agent_ledger, so any layer may use it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EFFECT_FIELDS", "ERROR_PARTS", "TIME_FIELDS"]

#: Every field of ``agent_ledger.effects.Effect``, in declaration order.
EFFECT_FIELDS: Final = (
    "id", "idem_key", "workflow_id", "call_id", "tool", "status", "args_canonical",
    "resource_id_canonical", "result", "error", "dedup_count", "attempt", "created_at",
    "updated_at", "completed_at", "heartbeat_at", "decided_by", "decision_note", "decided_at",
    # Schema version 2, last so that exports keep their columns where they were.
    "started_at", "executions", "lease_ms", "tries", "history",
    # Schema version 3: a model call's tokens and price (ledger.llm).
    "usage",
    # Schema version 3 (ambiguous attempts parked for a person).
    "park_attempt", "worker",
)  # fmt: skip

#: The fields that hold a moment (named ``*_at``; a test checks they are the datetimes).
TIME_FIELDS: Final = frozenset(name for name in EFFECT_FIELDS if name.endswith("_at"))

#: ``error`` is one field of an effect and two flat values wherever effects are
#: written out flat (SQL rows, exports): its message and its code.
ERROR_PARTS: Final = ("error_message", "error_code")
