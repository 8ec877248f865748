"""Listing effects for people and tools: filters, pages and their cursors."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime

import orjson

from agent_ledger.effects import Effect
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import EffectQuery

#: The largest page ``list_effects`` returns.
MAX_PAGE_SIZE = 1_000


@dataclass(frozen=True, slots=True)
class EffectPage:
    """One page of ``list_effects``; ``next_cursor`` is None on the last page."""

    effects: list[Effect]
    next_cursor: str | None


def encode_cursor(last: Effect) -> str:
    """An opaque token for "the page after ``last``"."""
    raw = orjson.dumps([last.created_at.isoformat(), last.id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, effect_id = orjson.loads(base64.urlsafe_b64decode(padded))
        moment = datetime.fromisoformat(created_at)
        if moment.tzinfo is None or not isinstance(effect_id, str):
            raise ValueError(cursor)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise EffectLedgerValidationError(
            "cursor is not one that list_effects returned; pass next_cursor unchanged",
            field="cursor",
        ) from None
    return moment, effect_id


def build_query(
    *,
    workflow_id: str | None,
    tool: str | None,
    status: EffectStatus | str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    cursor: str | None,
) -> EffectQuery:
    """Check every filter and turn them into an ``EffectQuery``."""
    for value, name in ((workflow_id, "workflow_id"), (tool, "tool"), (cursor, "cursor")):
        if value is not None and not isinstance(value, str):
            raise EffectLedgerValidationError(
                f"{name} must be a string or None, got {type(value).__name__}", field=name
            )
    for moment, name in ((since, "since"), (until, "until")):
        if moment is not None and (not isinstance(moment, datetime) or moment.tzinfo is None):
            raise EffectLedgerValidationError(
                f"{name} must be a timezone-aware datetime, got {moment!r}", field=name
            )
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE_SIZE:
        raise EffectLedgerValidationError(
            f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}", field="limit"
        )
    return EffectQuery(
        workflow_id=workflow_id,
        tool=tool,
        status=parse_status(status) if status is not None else None,
        since=since,
        until=until,
        limit=limit,
        before=decode_cursor(cursor) if cursor is not None else None,
    )


def parse_status(status: EffectStatus | str) -> EffectStatus:
    try:
        return EffectStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in EffectStatus)
        raise EffectLedgerValidationError(
            f"unknown status {status!r}; expected one of: {known}", field="status"
        ) from None
