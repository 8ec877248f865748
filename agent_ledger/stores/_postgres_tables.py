"""What PostgresStore's table families (sagas, budgets) share with the store.

Each family is a mixin kept in a module of its own; this is the part of the
store they use (its schema and its one way to run a statement), declared
once for the type checker, and how a ``timestamptz`` becomes a receipt's time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

from psycopg import AsyncConnection, sql

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

    def _composed(
        self, tables: Mapping[str, str], texts: Mapping[str, LiteralString]
    ) -> dict[str, sql.Composed]:
        """Each statement of ``texts`` by its name, its ``{table}`` placeholders naming
        ``tables`` (placeholder -> table name) in the store's schema."""
        names = {key: sql.Identifier(self.schema, table) for key, table in tables.items()}
        return {name: sql.SQL(text).format(**names) for name, text in texts.items()}
