"""Stores: where effects live. Each one implements ``agent_ledger.stores.base.Store``."""

from __future__ import annotations

from agent_ledger.stores.base import Store
from agent_ledger.stores.memory import MemoryStore

__all__ = ["MemoryStore", "Store"]
