"""What PostgresStore's table families (sagas, budgets) share with the store.

Each family is a mixin kept in a module of its own; this is the part of the
store they use (its schema and its one way to run a statement), declared
once for the type checker, and how a ``timestamptz`` becomes a receipt's time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import AsyncConnection

_T = TypeVar("_T")
Connection = AsyncConnection[Any]


def utc(moment: datetime) -> datetime:
    """A time psycopg returned (in the session's TimeZone) as UTC, as receipts are."""
    return moment if moment.tzinfo is UTC else moment.astimezone(UTC)


class PostgresTables:
    """Base of the mixins: what they use of ``PostgresStore``."""

    if TYPE_CHECKING:
        schema: str

        async def _statement(
            self,
            operation: str,
            work: Callable[[Connection], Awaitable[_T]],
            tx: object | None,
            *,
            idem_key: str | None = None,
            effect_id: str | None = None,
        ) -> _T: ...
