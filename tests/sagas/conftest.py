"""A shop whose tools log what they do, for the saga tests on every store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent_ledger import Effect, EffectLedger, RetryPolicy
from agent_ledger.sagas._saga import Saga
from agent_ledger.tools import Tool

FAST_RETRY = RetryPolicy(on=Exception, attempts=3, initial_ms=1, max_ms=5, jitter=0)


class Declined(Exception):
    code = "declined"


@dataclass
class Shop:
    """Forward tools ``step1``..``step4`` (step N fails when N is in ``failing``), each
    undone by ``undo_stepN``; ``log`` is every handler call in order."""

    ledger: EffectLedger
    failing: set[str] = field(default_factory=set)
    log: list[str] = field(default_factory=list)
    forwards: dict[str, Effect] = field(default_factory=dict)
    tools: dict[str, Tool[Any]] = field(default_factory=dict)
    undo_fails: set[str] = field(default_factory=set)

    def add(self, name: str, **options: Any) -> Tool[Any]:
        shop = self

        async def forward(item: str) -> dict[str, str]:
            shop.log.append(name)
            await asyncio.sleep(0)
            if name in shop.failing:
                raise Declined(f"{name} declined")
            return {"done": f"{name}:{item}"}

        async def undo(forward: Effect) -> str:
            shop.log.append(f"undo {name}")
            shop.forwards[name] = forward
            if name in shop.undo_fails:
                raise ConnectionError(f"undo {name} is down")
            return f"undid {name}"

        options.setdefault("compensate", f"undo.{name}")
        tool = self.ledger.tool(name, **options)(forward)
        self.ledger.tool(f"undo.{name}", retry=FAST_RETRY)(undo)
        self.tools[name] = tool
        return tool

    def __getitem__(self, name: str) -> Tool[Any]:
        return self.tools[name]


def shop_of(ledger: EffectLedger, *names: str, **options: Any) -> Shop:
    shop = Shop(ledger)
    for name in names:
        shop.add(name, **options)
    return shop


def only(log: list[str], keep: Callable[[str], bool]) -> list[str]:
    return [entry for entry in log if keep(entry)]


async def owner_dies(saga: Saga, ledger: EffectLedger) -> None:
    """The saga's owner process dies without a sound: its saga stops heartbeating,
    and so do the effects its ledger holds (a handler stalled in it stays stalled)."""
    assert saga._heartbeat is not None
    saga._heartbeat.stop()
    ledger._engine._heartbeats._running.clear()
