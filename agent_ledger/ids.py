"""Effect ids: what one looks like, and how a store makes a new one.

An effect id is a canonical UUID string: lowercase, hyphenated, 36
characters, exactly what ``str(uuid.UUID(...))`` gives. Every store assigns
ids in that form, and every store treats any other text (uppercase, braces,
no hyphens, a ``urn:`` prefix) as naming no effect, so looking an effect up
gives the same answer whichever store holds it.
"""

from __future__ import annotations

import os
import re
from typing import Final

__all__ = ["is_effect_id", "new_effect_id"]


#: ``str(uuid.UUID(...))``'s form: lowercase hex digits, hyphenated 8-4-4-4-12.
_CANONICAL: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_effect_id(text: object) -> bool:
    """Whether ``text`` is an effect id: a canonical (lowercase, hyphenated) UUID string.

    The same answer as ``str(uuid.UUID(text)) == text`` (a test holds them
    equal), at a tenth of its cost: every commit and heartbeat checks one.
    """
    return isinstance(text, str) and _CANONICAL.fullmatch(text) is not None


#: The RFC 9562 variant nibble (binary 10xx) for each random hex digit: four
#: digits map to each of 8, 9, a and b, so the choice stays uniform.
_VARIANT: Final = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def new_effect_id() -> str:
    """A random (version 4) UUID string from the operating system's randomness.

    Not from the ``random`` module: an application that calls
    ``random.seed(42)`` (common in ML code), a forked worker that inherits its
    parent's generator, or a test framework that seeds it would make two
    processes hand out the same ids. Ids must be unique across processes.

    Built from 16 random bytes as text, with the version and variant digits
    set, which is what ``str(uuid.uuid4())`` gives (122 random bits) at a
    quarter of its cost: a fresh ``run()`` makes one.
    """
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"
