"""agent-ledger 0.2.x's store methods, on every store of this version.

0.2.x code called its store directly (``find_by_idem_key``, ``find_by_id``,
``list_effects()``, ``MemoryStore.size``, ``upsert``, ...). Those with the
same meaning here still work and warn (``DeprecationWarning``) with the new
spelling; the others raise ``RemovedNameError`` saying what to use instead
(``agent_ledger.legacy.names.STORE_METHODS`` lists them all). Nothing here
is part of the ``Store`` protocol: a store of your own need not have them.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, NoReturn

from agent_ledger.errors import RemovedNameError
from agent_ledger.legacy.names import STORE_METHODS
from agent_ledger.stores.base import EffectQuery

if TYPE_CHECKING:
    from agent_ledger.effects import Effect
    from agent_ledger.stores.base import Store

__all__ = ["LegacyStoreMethods", "all_effects"]

#: How many effects a bare ``list_effects()`` reads at a time.
_PAGE = 500


def _deprecated(store: object, old: str, new: str, *, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{type(store).__name__}.{old} is agent-ledger 0.2.x's; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _removed(store: object, name: str) -> NoReturn:
    raise RemovedNameError(name, STORE_METHODS[name], owner=type(store).__name__)


async def all_effects(store: Store) -> list[Effect]:
    """0.2.x's bare ``list_effects()``: every effect, oldest first (as its MemoryStore).

    Read a page at a time, by keyset, so effects created meanwhile neither
    repeat nor shift a page."""
    # Named at the caller of the store's list_effects(), two frames up.
    _deprecated(
        store, "list_effects() with no query", "ledger.list_effects(...) (pages)", stacklevel=4
    )
    newest_first: list[Effect] = []
    before = None
    while True:
        page = await store.list_effects(EffectQuery(limit=_PAGE, before=before))
        newest_first.extend(page)
        if len(page) < _PAGE:
            return newest_first[::-1]
        before = (page[-1].created_at, page[-1].id)


#: The keywords only 0.2.x's ``transition(effect_id, from_status, to_status, result=,
#: error=, tx=)`` took (this version's ``error`` is an ``EffectError``, never a dict).
_V02_TRANSITION_KEYWORDS: Final = frozenset({"from_status", "to_status", "result"})


def _refuse_0_2_transition(
    transition: Callable[..., Awaitable[Effect | None]],
) -> Callable[..., Awaitable[Effect | None]]:
    """Wrap a store's ``transition`` so that 0.2.x's call shape raises
    ``RemovedNameError`` instead of a bare ``TypeError`` about positional arguments.

    Only the shape is checked (one extra call frame, on decisions only); every
    call of this version's shape goes straight through."""

    @functools.wraps(transition)
    async def checked(self: object, *args: object, **kwargs: object) -> Effect | None:
        if (
            len(args) > 1
            or _V02_TRANSITION_KEYWORDS & kwargs.keys()
            or (isinstance(kwargs.get("error"), dict))
        ):
            _removed(self, "transition")
        return await transition(self, *args, **kwargs)

    return checked


class LegacyStoreMethods:
    """0.2.x's ``EffectStore`` methods that this version's stores no longer define."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("transition")
        if own is not None:
            cls.transition = _refuse_0_2_transition(own)  # type: ignore[attr-defined]

    @property
    def size(self) -> int:
        """0.2.x's ``MemoryStore.size``: only a ``MemoryStore`` still has it (see the error)."""
        # An AttributeError, not RemovedNameError (an ImportError): hasattr()
        # and other probes of an attribute must still answer False.
        raise AttributeError(
            f"{type(self).__name__}.size: 0.2.x's MemoryStore.size counted the effects in "
            "memory; here use (await store.stats()).total (or len(store) on a MemoryStore); "
            "see docs/migrating-from-0.2.md",
            name="size",
            obj=self,
        )

    async def find_by_idem_key(
        self: Store, idem_key: str, tx: object | None = None
    ) -> Effect | None:
        """0.2.x's name for :meth:`Store.find` (deprecated)."""
        _deprecated(self, "find_by_idem_key(idem_key)", "find(idem_key)")
        return await self.find(idem_key, tx=tx)

    async def find_by_id(self: Store, effect_id: str, tx: object | None = None) -> Effect | None:
        """0.2.x's name for :meth:`Store.get` (deprecated)."""
        _deprecated(self, "find_by_id(effect_id)", "get(effect_id)")
        return await self.get(effect_id, tx=tx)

    async def upsert(self, *args: object, **kwargs: object) -> NoReturn:
        """0.2.x's insert-or-get: gone (see the error)."""
        _removed(self, "upsert")

    async def claim_for_processing(self, *args: object, **kwargs: object) -> NoReturn:
        """0.2.x's claim by id and status: gone (see the error)."""
        _removed(self, "claim_for_processing")

    async def increment_dedup_count(self, *args: object, **kwargs: object) -> NoReturn:
        """0.2.x's separate duplicate count: gone (see the error)."""
        _removed(self, "increment_dedup_count")
