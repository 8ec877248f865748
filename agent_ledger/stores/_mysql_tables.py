"""What MySQLStore's table families (sagas, budgets) share with the store.

Each family is a mixin kept in a module of its own; this is the part of the
store they use (its one way to run work on a connection, alone or as one
transaction), declared once for the type checker, and how a ``DATETIME(6)``
(UTC, without a zone, as the driver returns it) becomes a receipt's time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

_T = TypeVar("_T")
#: The driver's cursor (asyncmy's; untyped here so the mixins need no driver import).
Cursor = Any
#: MySQL error numbers the store tells apart.
DUPLICATE_KEY: Final = 1062


def utc(moment: datetime) -> datetime:
    """A ``DATETIME(6)`` read back (naive, UTC by construction) as a receipt's time.

    ``combine`` rather than ``replace(tzinfo=UTC)``: the same value at a third of
    the cost (keyword parsing), and an effect has up to six times to convert.
    """
    return datetime.combine(moment, moment.time(), UTC)


def stored(moment: datetime) -> datetime:
    """A receipt's time as a ``DATETIME(6)`` parameter: naive UTC."""
    if moment.tzinfo is None:
        return moment
    return moment.astimezone(UTC).replace(tzinfo=None)


def error_number(exc: BaseException) -> int | None:
    """The MySQL error number of a driver error (``args[0]``), or None."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


async def insert_new(cur: Cursor, statement: str, params: dict[str, object]) -> bool:
    """Run an INSERT of a row that may exist already; False if it did (error 1062).

    InnoDB undoes only the failed statement, so a transaction around it goes on.
    """
    try:
        await cur.execute(statement, params)
    except Exception as exc:
        if error_number(exc) == DUPLICATE_KEY:
            return False
        raise
    return True


class MySQLTables:
    """Base of the mixins: what they use of ``MySQLStore``."""

    if TYPE_CHECKING:

        async def _run(
            self,
            operation: str,
            work: Callable[[Cursor], Awaitable[_T]],
            tx: object | None,
            *,
            atomic: bool,
            idem_key: str | None = None,
            effect_id: str | None = None,
        ) -> _T: ...

    async def _read_one(
        self,
        operation: str,
        statement: str,
        params: dict[str, object],
        convert: Callable[[tuple[Any, ...]], _T],
        tx: object | None = None,
    ) -> _T | None:
        """The row ``statement`` selects, through ``convert``; None when there is none."""

        async def work(cur: Cursor) -> _T | None:
            await cur.execute(statement, params)
            row = await cur.fetchone()
            return None if row is None else convert(row)

        return await self._run(operation, work, tx, atomic=False)
