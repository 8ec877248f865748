"""The limits on what a handler's outcome may put in the ledger, the same on every store.

A handler's outcome is recorded after its side effect happened: an outcome
the store cannot hold must not leave the effect ``processing`` (the next
caller would take it over and run the handler again). So every limit is
checked before the commit, and an outcome past one is recorded in a form
the store can hold, that replays honestly (docs/concepts.md, "Limits"):

* an error code longer than :data:`MAX_ERROR_CODE_CHARS` is cut to that
  length (MariaDB keeps codes in a ``TEXT`` column of 65,535 bytes);
* an error message longer than :data:`MAX_ERROR_MESSAGE_CHARS` is cut to
  that length, and the message says how many characters were left out;
* a result (with its usage) bigger than the store holds (``Store``'s
  optional ``max_result_bytes``: MariaDB/MySQL's ``max_allowed_packet``,
  read at connect) is recorded as failed with code ``result_too_large``,
  and the caller gets ``EffectLedgerValidationError`` (field ``result_size``).
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_ERROR_CODE_CHARS", "MAX_ERROR_MESSAGE_CHARS", "cap_code", "cap_message"]

#: The most characters an error code keeps.
MAX_ERROR_CODE_CHARS: Final = 200
#: The most characters of an error message kept (a note of the rest follows).
MAX_ERROR_MESSAGE_CHARS: Final = 10_000


def cap_code(code: str) -> str:
    """``code``, cut to :data:`MAX_ERROR_CODE_CHARS`."""
    return code[:MAX_ERROR_CODE_CHARS]


def cap_message(message: str) -> str:
    """``message``, cut to :data:`MAX_ERROR_MESSAGE_CHARS` with a note of what was left out."""
    left_out = len(message) - MAX_ERROR_MESSAGE_CHARS
    if left_out <= 0:
        return message
    return f"{message[:MAX_ERROR_MESSAGE_CHARS]}… [{left_out} more characters not stored]"
