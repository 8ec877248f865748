"""Turning the SQL stores' rows into effects and stats: one mapping for both."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Final

import orjson

from agent_ledger.effects import Effect, EffectError
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import LedgerStats

#: The columns, in order, that every SQL store's effect queries return.
EFFECT_COLUMN_NAMES: Final = (
    "id", "idem_key", "workflow_id", "call_id", "tool", "status", "args_canonical",
    "resource_id_canonical", "result", "error_message", "error_code", "dedup_count",
    "attempt", "created_at", "updated_at", "completed_at", "heartbeat_at", "decided_by",
    "decision_note", "decided_at",
)  # fmt: skip
EFFECT_WIDTH: Final = len(EFFECT_COLUMN_NAMES)
STATUS_BY_VALUE: Final = {s.value: s for s in EffectStatus}


def effect_from_row(row: tuple[Any, ...], to_time: Callable[[Any], datetime]) -> Effect:
    """An ``Effect`` from the first ``EFFECT_WIDTH`` columns; ``to_time`` reads a stored time."""
    (id_, idem_key, workflow_id, call_id, tool, status, args, resource, result,
     error_message, error_code, dedup_count, attempt, created, updated, completed,
     heartbeat, decided_by, decision_note, decided) = row[:EFFECT_WIDTH]  # fmt: skip
    return Effect(
        id=id_,
        idem_key=idem_key,
        workflow_id=workflow_id,
        call_id=call_id,
        tool=tool,
        status=STATUS_BY_VALUE[status],
        args_canonical=args,
        resource_id_canonical=resource,
        result=None if result is None else orjson.loads(result),
        error=None if error_message is None else EffectError(error_message, error_code),
        dedup_count=dedup_count,
        attempt=attempt,
        created_at=to_time(created),
        updated_at=to_time(updated),
        completed_at=None if completed is None else to_time(completed),
        heartbeat_at=to_time(heartbeat),
        decided_by=decided_by,
        decision_note=decision_note,
        decided_at=None if decided is None else to_time(decided),
    )


def stats_from_groups(groups: Iterable[tuple[EffectStatus, str, int, int]]) -> LedgerStats:
    """``LedgerStats`` from (status, tool, effects, duplicates) groups."""
    by_status = dict.fromkeys(EffectStatus, 0)
    by_tool: dict[str, int] = {}
    duplicates = 0
    for status, tool, count, dedup in groups:
        by_status[status] += count
        by_tool[tool] = by_tool.get(tool, 0) + count
        duplicates += int(dedup)
    return LedgerStats(
        total=sum(by_status.values()), by_status=by_status, by_tool=by_tool, duplicates=duplicates
    )
