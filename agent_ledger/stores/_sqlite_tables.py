"""What SqliteStore's table families (sagas, budgets) share with the store.

Times are stored as integer microseconds since the Unix epoch (UTC); each
family is a mixin kept in a module of its own, and this is the part of the
store they use (its gate and its one way to run work on its thread),
declared once for the type checker.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

_T = TypeVar("_T")
EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(moment: datetime) -> int:
    """A time as the column keeps it."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    """A column's time as a receipt's (UTC)."""
    return EPOCH + timedelta(microseconds=us)


class SqliteTables:
    """Base of the mixins: what they use of ``SqliteStore``."""

    if TYPE_CHECKING:

        async def _enter(self, tx: object | None) -> Any: ...

        async def _run(
            self,
            operation: str,
            work: Callable[[sqlite3.Connection, int], _T],
            tx: Any,
            *,
            write: bool,
            idem_key: str | None = None,
            effect_id: str | None = None,
        ) -> _T: ...

    async def _read_one(
        self,
        operation: str,
        statement: str,
        params: tuple[object, ...],
        convert: Callable[[tuple[Any, ...]], _T],
        tx: object | None = None,
        *,
        idem_key: str | None = None,
    ) -> _T | None:
        """The row ``statement`` selects, through ``convert``; None when there is none."""
        await self._enter(tx)

        def work(conn: sqlite3.Connection, now: int) -> _T | None:
            row = conn.execute(statement, params).fetchone()
            return None if row is None else convert(row)

        return await self._run(operation, work, tx, write=False, idem_key=idem_key)
