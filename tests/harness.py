"""Store harnesses: a store under test plus a back door into what it holds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    LedgerDefaults,
    LedgerHooks,
    ManualClock,
    RunOptions,
)
from agent_ledger.stores.base import Store
from agent_ledger.stores.memory import MemoryStore


class StoreHarness(Protocol):
    kind: str
    store: Store

    async def age(self, ms: float) -> None:
        """Make every stored timestamp ``ms`` older, as if that much time passed."""
        ...

    async def raw_count(self) -> int:
        """How many effects are stored, read without the store's API."""
        ...

    def ledger(self, defaults: RunOptions | None = None) -> EffectLedger: ...


@dataclass
class MemoryHarness:
    kind: str = "memory"
    clock: ManualClock = field(default_factory=ManualClock)
    store: MemoryStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = MemoryStore(clock=self.clock)

    async def age(self, ms: float) -> None:
        self.clock.advance(ms=ms)

    async def raw_count(self) -> int:
        return len(self.store._rows)

    def ledger(self, defaults: RunOptions | None = None) -> EffectLedger:
        return make_ledger(self.store, defaults)


def make_ledger(
    store: Store, defaults: RunOptions | None = None, hooks: LedgerHooks | None = None
) -> EffectLedger:
    return EffectLedger(
        EffectLedgerOptions(
            store=store, defaults=LedgerDefaults(run=defaults or RunOptions()), hooks=hooks
        )
    )


STORE_KINDS = [
    pytest.param("memory", id="memory"),
]


@asynccontextmanager
async def open_harness(kind: str) -> AsyncIterator[StoreHarness]:
    if kind == "memory":
        yield MemoryHarness()
        return
    raise ValueError(f"unknown store kind {kind!r}")
