"""Stores: where effects live. Each one implements ``agent_ledger.stores.base.Store``."""

from __future__ import annotations

from agent_ledger.legacy.names import resolve_in
from agent_ledger.stores.base import Store
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.stores.url import open_store

__all__ = ["MemoryStore", "SqliteStore", "Store", "open_store"]


def __getattr__(name: str) -> object:
    """0.2.x's ``EffectStore`` (and ``TxT``): a deprecated alias, or guidance."""
    return resolve_in(__name__, name)
