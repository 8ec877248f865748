"""The Store protocol's own data: which steps exist and which are safe to repeat."""

from __future__ import annotations

import inspect
import re

from agent_ledger.stores import base
from agent_ledger.stores.base import REPEATABLE_STEPS, STEP_REPEATABLE, Store
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.stores.sqlite import SqliteStore

#: Protocol methods that are not ledger steps (or are an alias due to go).
NOT_STEPS = {"close", "subscribe", "transaction"}


def _steps(cls: type) -> set[str]:
    return {
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    } - NOT_STEPS


def test_every_step_says_whether_it_is_safe_to_repeat() -> None:
    """A step added to the protocol must be added to the table (and its docs)."""
    assert set(STEP_REPEATABLE) == _steps(Store)
    assert {s for s, ok in STEP_REPEATABLE.items() if ok} == REPEATABLE_STEPS
    assert not REPEATABLE_STEPS & {"commit", "transition", "purge"}
    table = base.__doc__ or ""
    for step in STEP_REPEATABLE:
        assert re.search(rf"^(\S+, )*{step}\b", table, re.MULTILINE), step


def test_every_store_implements_every_step() -> None:
    for cls in (MemoryStore, SqliteStore, PostgresStore):
        assert _steps(Store) <= {
            name for name in dir(cls) if inspect.iscoroutinefunction(getattr(cls, name))
        }, cls
