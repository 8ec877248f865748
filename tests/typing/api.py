"""Type-checked by mypy (see pyproject), never run: locks the public types."""

from __future__ import annotations

from typing import assert_type

from agent_ledger import Effect, EffectLedger, JSONValue, MemoryStore, ToolCall
from agent_ledger.effects import BeginResult


async def check(ledger: EffectLedger, call: ToolCall) -> None:
    async def async_handler(effect: Effect) -> dict[str, int]:
        return {"n": effect.attempt}

    def sync_handler(effect: Effect) -> list[str]:
        return [effect.idem_key]

    # run() returns what the handler returns, async or not.
    assert_type(await ledger.run(call, async_handler), dict[str, int])
    assert_type(await ledger.run(call, sync_handler), list[str])
    assert_type(await ledger.begin(call), BeginResult[object])
    assert_type(await ledger.find_by_idem_key("k"), Effect | None)
    assert_type(ledger.idem_key(call), str)


def effect_views(effect: Effect) -> None:
    # A handler reads its call's args (and resource) decoded, without the ToolCall.
    assert_type(effect.args, dict[str, JSONValue])
    assert_type(effect.resource, dict[str, JSONValue] | None)
    assert_type(effect.args_canonical, str)


def stores_implement_the_protocol(pool: object) -> None:
    from psycopg_pool import AsyncConnectionPool

    from agent_ledger import MemoryStore, Store
    from agent_ledger.stores.postgres import PostgresStore

    memory: Store = MemoryStore()
    postgres: Store = PostgresStore(AsyncConnectionPool("", open=False))
    del memory, postgres


async def tools(ledger: EffectLedger) -> None:
    @ledger.tool("t.async")
    async def fetch(url: str, *, effect: Effect) -> dict[str, int]:
        return {"n": 1}

    @ledger.tool("t.sync")
    def write(path: str) -> list[str]:
        return [path]

    # A tool is awaited whether the function is async or not, and returns its type.
    assert_type(await fetch("u"), dict[str, int])
    assert_type(await write("p"), list[str])


async def retries_and_schema(ledger: EffectLedger, effect: Effect) -> None:
    from agent_ledger import RetryPolicy
    from agent_ledger.effects import (
        Parked,
        Reopening,
        RetryableFailure,
        Scoped,
        Settlement,
        TryFailure,
    )
    from agent_ledger.stores.base import SchemaMigration

    @ledger.tool("t.retried", retry=RetryPolicy(on=(TimeoutError, ConnectionError)))
    async def charge(order: str) -> int:
        return 1

    assert_type(await charge("o"), int)
    assert_type(await ledger.reopen("k", by="ops", reason="fixed"), bool)
    assert_type(await ledger.store.migrate(), SchemaMigration)
    assert_type(effect.tries, int)
    for event in effect.history:
        assert_type(event, TryFailure | Reopening | Parked | Settlement | Scoped | RetryableFailure)


async def replays(ledger: EffectLedger, store: MemoryStore) -> None:
    from pathlib import Path

    from agent_ledger.replay import Replay

    # A store or an export's path (str or Path); `with` and `async with` give the Replay.
    async with ledger.replay("wf", source=store) as replay:
        assert_type(replay, Replay)
    with ledger.replay("wf", source=Path("wf.jsonl"), strict=False) as replay:
        assert_type(replay, Replay)
    assert_type(ledger.replay("wf", source="wf.jsonl"), Replay)
