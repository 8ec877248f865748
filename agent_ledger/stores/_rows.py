"""Turning the SQL stores' rows into effects and stats: one mapping for both."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Final

import orjson

from agent_ledger.effects import (
    Effect,
    EffectError,
    effect_from_values,
    history_from_json,
    usage_from_json,
)
from agent_ledger.fields import ERROR_PARTS, TIME_FIELDS
from agent_ledger.status import EffectStatus
from agent_ledger.stores._columns import ROW_COLUMNS
from agent_ledger.stores.base import LedgerStats

#: How many values of a row make the effect; a query may add one more after them
#: (begin's ``created``, claim's ``claimed``).
EFFECT_WIDTH: Final = len(ROW_COLUMNS)
STATUS_BY_VALUE: Final = {s.value: s for s in EffectStatus}

# Where effect_from_row finds what it converts, by position in ROW_COLUMNS.
_STATUS: Final = ROW_COLUMNS.index("status")
_RESULT: Final = ROW_COLUMNS.index("result")
_ERROR: Final = ROW_COLUMNS.index(ERROR_PARTS[0])
_HISTORY: Final = ROW_COLUMNS.index("history")
_USAGE: Final = ROW_COLUMNS.index("usage")
_TIMES: Final = tuple(ROW_COLUMNS.index(name) for name in sorted(TIME_FIELDS))


def effect_from_row(row: tuple[Any, ...], to_time: Callable[[Any], datetime]) -> Effect:
    """An ``Effect`` from the first ``EFFECT_WIDTH`` values of a row (``ROW_COLUMNS``
    order); ``to_time`` reads a stored time.

    Positional on purpose: the row is ``EFFECT_FIELDS`` in ``Effect``'s own
    order (a test holds them equal), with ``error`` as its two parts.
    """
    values = list(row[:EFFECT_WIDTH])
    for i in _TIMES:
        if values[i] is not None:
            values[i] = to_time(values[i])
    values[_STATUS] = STATUS_BY_VALUE[values[_STATUS]]
    if values[_RESULT] is not None:
        values[_RESULT] = orjson.loads(values[_RESULT])
    # Before the error's two parts become one: the index is the row's.
    values[_HISTORY] = history_from_json(values[_HISTORY])
    values[_USAGE] = usage_from_json(values[_USAGE])
    message, code = values[_ERROR], values[_ERROR + 1]
    values[_ERROR : _ERROR + 2] = [None if message is None else EffectError(message, code)]
    return effect_from_values(values)


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
