"""How the stores lay out an effect's fields (``agent_ledger.fields``) as SQL rows.

How a field is kept where it is not kept as-is (each dialect's small
mapping lives in its queries module, next to its SQL):

=======================  ===============================  ============================
field                    SQLite column                    PostgreSQL column
=======================  ===============================  ============================
``*_at`` (TIME_FIELDS)   ``*_us``: integer µs since 1970  ``*_at``: timestamptz
``error``                ``error_message``, ``error_code``  ``error`` jsonb, read as
                                                          ``error->>'message'`` etc.
``id``, ``result``       text                             uuid, json (read as text)
=======================  ===============================  ============================

Whatever the storage, a query returns the values in :data:`ROW_COLUMNS`
order (``error`` as its two parts), which is what ``effect_from_row`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from agent_ledger.fields import EFFECT_FIELDS, ERROR_PARTS

__all__ = ["ROW_COLUMNS", "select_list"]

#: The values of an effect row, in order, as every SQL query returns them.
ROW_COLUMNS: Final = tuple(
    part for name in EFFECT_FIELDS for part in (ERROR_PARTS if name == "error" else (name,))
)


def select_list(expressions: Mapping[str, str] | None = None, *, prefix: str = "") -> str:
    """The SQL select list of an effect row: ``ROW_COLUMNS`` joined by commas.

    ``expressions`` gives a dialect's expression for a column it stores
    differently (e.g. ``created_us`` for ``created_at``; alias it to the row
    name, like ``id::text AS id``, where a query reads it back by name);
    other columns are read as ``prefix + name``. Built only from the
    constant names here and in the queries modules, never from caller text.
    """
    expressions = expressions or {}
    unknown = set(expressions) - set(ROW_COLUMNS)
    if unknown:
        raise ValueError(f"not columns of an effect row: {sorted(unknown)}")
    return ", ".join(expressions.get(name, prefix + name) for name in ROW_COLUMNS)
