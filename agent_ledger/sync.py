"""Open a ledger for sync code: its store lives on a background loop the ledger owns.

A store that must be opened asynchronously (PostgreSQL's pool) cannot be
opened by sync code directly, and it belongs to the event loop it was
opened on. ``open_ledger`` starts the background loop first, opens the
store there, and hands both to the ledger, which then runs every sync call
(``tool.sync()``, ``ledger.run_sync()``, ``ledger.call_sync()``) on that
loop and closes the store with ``ledger.close_sync()``.
"""

from __future__ import annotations

from agent_ledger.background import BackgroundLoop
from agent_ledger.ledger import EffectLedger
from agent_ledger.options import EffectLedgerOptions, LedgerDefaults, LedgerHooks
from agent_ledger.stores.url import open_store

__all__ = ["open_ledger"]


def open_ledger(
    url: str,
    *,
    defaults: LedgerDefaults | None = None,
    hooks: LedgerHooks | None = None,
    max_args_size_bytes: int | None = None,
    create: bool = True,
) -> EffectLedger:
    """A ledger on the store ``url`` names (as ``open_store``), for sync code.

    Close it with ``ledger.close_sync()``, which closes the store too.
    """
    background = BackgroundLoop(name="agent-ledger-sync")
    try:
        store = background.run(open_store(url, create=create))
    except BaseException:
        background.stop()
        raise
    try:
        options = EffectLedgerOptions(
            store=store,
            defaults=defaults if defaults is not None else LedgerDefaults(),
            max_args_size_bytes=max_args_size_bytes,
            hooks=hooks,
        )
        ledger = EffectLedger(options)
    except BaseException:
        background.run(store.close())
        background.stop()
        raise
    ledger._adopt_background(background, owns_store=True)
    return ledger
