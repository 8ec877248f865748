"""Reading the ledger for people and tools: lookups, filtered pages, stats, purge.

Nothing here changes an effect's status; purge only removes effects whose
outcome is final.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Required, TypedDict, Unpack

import orjson

from agent_ledger.backoff import MAX_MS
from agent_ledger.effects import Effect, storable_text
from agent_ledger.errors import EffectLedgerValidationError, require_str
from agent_ledger.ids import is_effect_id
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import EffectQuery, LedgerStats, SchemaCheck, Store

#: The largest page ``list_effects`` returns.
MAX_PAGE_SIZE = 1_000
#: The longest span a duration filter (``min_duration``, ``max_duration``) or
#: ``purge``'s ``older_than`` accepts: about 1000 years. The stores hold spans
#: differently (SQLite and PostgreSQL in 64-bit microseconds, about 292,000
#: years; MemoryStore in Python's ``timedelta``, about 2.7 million years) and
#: ``purge`` subtracts the span from now, so past a common bound one store
#: would answer while another overflows. No handler ran, and no effect was
#: kept, that long, so the bound costs nothing.
MAX_SPAN: Final = timedelta(milliseconds=MAX_MS)
#: The oldest cutoff ``purge`` accepts (``MAX_SPAN``).
MAX_PURGE_AGE: Final = MAX_SPAN
#: The shortest idempotency-key prefix ``lookup`` accepts.
MIN_KEY_PREFIX: Final = 8
_HEX: Final = re.compile(r"[0-9a-f]+")


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


class ListFilters(TypedDict, total=False):
    """The filters of ``list_effects``, by name, declared once for every layer that
    passes them on; ``build_query`` checks them. ``limit`` is the only one required."""

    workflow_id: str | None
    tool: str | None
    status: EffectStatus | str | None
    since: datetime | None
    until: datetime | None
    limit: Required[int]
    cursor: str | None
    call_id: str | None
    error_code: str | None
    min_duration: timedelta | None
    max_duration: timedelta | None


#: The filters given as text, checked alike.
_TEXT_FILTERS: Final = ("workflow_id", "tool", "cursor", "call_id", "error_code")


def build_query(**filters: Unpack[ListFilters]) -> EffectQuery:
    """Check every filter and turn them into an ``EffectQuery``."""
    for name in _TEXT_FILTERS:
        value = filters.get(name)
        if value is not None and not isinstance(value, str):
            raise EffectLedgerValidationError(
                f"{name} must be a string or None, got {type(value).__name__}", field=name
            )
        if value is not None and name != "cursor" and storable_text(value) != value:
            # No stored text holds these (calls refuse NUL; error codes keep U+FFFD
            # in their place), and each store failed differently on them.
            stored_as = "; the ledger stored them as U+FFFD" if name == "error_code" else ""
            raise EffectLedgerValidationError(
                f"{name} must not contain U+0000 (NUL) or a lone surrogate: no stored "
                f"{name} holds one{stored_as}",
                field=name,
            )
    since, until = filters.get("since"), filters.get("until")
    for moment, name in ((since, "since"), (until, "until")):
        if moment is not None and (not isinstance(moment, datetime) or moment.tzinfo is None):
            raise EffectLedgerValidationError(
                f"{name} must be a timezone-aware datetime, got {moment!r}", field=name
            )
    shortest, longest = filters.get("min_duration"), filters.get("max_duration")
    for span, name in ((shortest, "min_duration"), (longest, "max_duration")):
        if span is not None:
            check_span(span, name)
    if shortest is not None and longest is not None and shortest > longest:
        raise EffectLedgerValidationError(
            f"min_duration ({shortest}) is longer than max_duration ({longest}): "
            "no effect could match",
            field="min_duration",
        )
    limit = filters["limit"]
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE_SIZE:
        raise EffectLedgerValidationError(
            f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}", field="limit"
        )
    status, cursor = filters.get("status"), filters.get("cursor")
    return EffectQuery(
        workflow_id=filters.get("workflow_id"),
        tool=filters.get("tool"),
        status=parse_status(status) if status is not None else None,
        since=since,
        until=until,
        limit=limit,
        before=decode_cursor(cursor) if cursor is not None else None,
        call_id=filters.get("call_id"),
        error_code=filters.get("error_code"),
        min_duration=shortest,
        max_duration=longest,
    )


def check_span(span: object, name: str) -> None:
    """Refuse a span that is not a ``timedelta`` from zero to ``MAX_SPAN``."""
    if not isinstance(span, timedelta) or span < timedelta(0):
        raise EffectLedgerValidationError(
            f"{name} must be a non-negative timedelta, got {span!r}", field=name
        )
    if span > MAX_SPAN:
        raise EffectLedgerValidationError(
            f"{name} must be at most {MAX_SPAN.days} days (about 1000 years), got {span!r}",
            field=name,
        )


def parse_status(status: EffectStatus | str) -> EffectStatus:
    try:
        return EffectStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in EffectStatus)
        raise EffectLedgerValidationError(
            f"unknown status {status!r}; expected one of: {known}", field="status"
        ) from None


class Audit:
    """The read side of one ledger (and purge)."""

    def __init__(self, store: Store, schema: SchemaCheck) -> None:
        self._store = store
        self._schema = schema

    async def list_effects(self, **filters: Unpack[ListFilters]) -> EffectPage:
        query = build_query(**filters)
        await self._schema.ensure()
        effects = await self._store.list_effects(query)
        last = effects[-1] if len(effects) == query.limit else None
        return EffectPage(effects, encode_cursor(last) if last is not None else None)

    async def stats(self) -> LedgerStats:
        await self._schema.ensure()
        return await self._store.stats()

    async def purge(self, older_than: timedelta, statuses: Iterable[EffectStatus | str]) -> int:
        check_span(older_than, "older_than")
        if isinstance(statuses, str) or not isinstance(statuses, Iterable):
            raise EffectLedgerValidationError(
                f"statuses must be a set of statuses, got {statuses!r}", field="statuses"
            )
        parsed = frozenset(parse_status(s) for s in statuses)
        await self._schema.ensure()
        return await self._store.purge(older_than=older_than, statuses=parsed)

    async def get_effect(self, effect_id: str) -> Effect | None:
        require_str(effect_id, "effect_id")
        await self._schema.ensure()
        return await self._store.get(effect_id)

    async def find_by_idem_key(self, idem_key: str) -> Effect | None:
        require_str(idem_key, "idem_key")
        await self._schema.ensure()
        return await self._store.find(idem_key)

    async def lookup(self, ref: str) -> Effect | None:
        require_str(ref, "ref")
        await self._schema.ensure()
        ref = ref.strip().lower()
        if is_effect_id(ref):
            return await self._store.get(ref)
        if not _HEX.fullmatch(ref) or len(ref) < MIN_KEY_PREFIX:
            raise EffectLedgerValidationError(
                f"{ref!r} is neither an effect id nor an idempotency key (or a prefix of one "
                f"with at least {MIN_KEY_PREFIX} hex characters)",
                field="ref",
            )
        if len(ref) == 64:
            return await self._store.find(ref)
        matches = await self._store.list_effects(EffectQuery(idem_key_prefix=ref, limit=2))
        if len(matches) > 1:
            raise EffectLedgerValidationError(
                f"key prefix {ref!r} matches several effects; give more characters",
                field="ref",
            )
        return matches[0] if matches else None
