"""The one limit on every name the ledger stores: at most 500 characters.

Names (a call's ``workflow_id``, ``tool`` and ``call_id``, a resource's
namespace and type, a saga's id and owner, who decided, ``by=``) are stored
in indexed columns. PostgreSQL refuses an index entry over about 2,700 bytes,
so a 4,000-character ``workflow_id`` failed there with a store error, after
SQLite and memory had accepted it. 500 characters is at most 2,000 bytes of
UTF-8 on every store, and every store refuses a longer name the same way,
with ``EffectLedgerValidationError`` naming the field, before anything is
stored.
"""

from __future__ import annotations

from typing import Final

from agent_ledger.errors import EffectLedgerValidationError

__all__ = ["MAX_NAME_LENGTH", "check_name_length"]

#: The most characters any stored name may have.
MAX_NAME_LENGTH: Final = 500


def check_name_length(value: str, field: str) -> None:
    """Refuse ``value`` (the name in ``field``) if it is longer than ``MAX_NAME_LENGTH``."""
    if len(value) > MAX_NAME_LENGTH:
        raise EffectLedgerValidationError(
            f"{field} is at most {MAX_NAME_LENGTH} characters, got one of {len(value)}; "
            "use a shorter name (a hash of a long one, say). Nothing was stored.",
            field=field,
        )
