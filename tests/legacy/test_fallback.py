"""``legacy_keys=True`` against rows the real agent-ledger 0.2.1 wrote, then imported.

Two calls whose key here differs from the one the importer recomputed:
0.2.1 ran ``scale=2.0`` (its canonical JSON kept ``2``, so the import keys
``scale=2``), and a call whose ``idempotency_keys`` named every arg (0.2.1's
key is then the all-args key, so the import keys the call without them).
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg
import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, ToolCall
from agent_ledger.effects import Effect
from agent_ledger.errors import EffectFailedError
from agent_ledger.stores.url import open_store
from tests.harness import DSN
from tests.legacy.conftest import V021
from tests.legacy.test_import import import_json, target, tool_call

__all__ = ["target"]

FLOAT = {"workflow_id": "wf-7", "tool": "resize", "args": {"scale": 2.0, "to": "img-1"}}
EVERY_ARG = {
    "workflow_id": "wf-8",
    "tool": "notify",
    "args": {"to": "ops", "msg": "deployed"},
    "idempotency_keys": ["msg", "to"],
}


def mappings(url: str) -> list[tuple[str, str]]:
    """The legacy key table, read straight from the database."""
    query = "SELECT legacy_key, idem_key FROM {}agent_ledger_legacy_keys ORDER BY 1"
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///") :]) as conn:
            return [tuple(row) for row in conn.execute(query.format(""))]
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(DSN) as conn:
        return [tuple(row) for row in conn.execute(query.format(f'"{schema}".'))]


@pytest.fixture
def written(scenario: list[dict[str, Any]], v021: V021) -> V021:
    """0.2.1's table with the scenario's rows and the two calls above."""
    for spec, result in ((FLOAT, {"w": 640}), (EVERY_ARG, "sent")):
        done = v021.call("run", {"call": spec, "result": result})
        assert done == {"result": result, "handler_ran": True}
    return v021


def test_a_call_keyed_differently_here_is_answered_with_the_option_only(
    written: V021, target: str
) -> None:
    report = import_json(written.url, target)
    assert report["imported"] == 13
    mapped = mappings(target)
    assert len(mapped) == 13
    # A second import changes nothing here either; a dry run writes nothing.
    assert import_json(written.url, target)["skipped"] == 13
    assert import_json(written.url, target, "--dry-run")["imported"] == 0
    assert mappings(target) == mapped

    ran: list[str] = []

    def handler(effect: Effect) -> object:
        ran.append(effect.tool)
        return "ran again"

    async def check() -> None:
        store = await open_store(target, create=False)
        try:
            legacy = EffectLedger(EffectLedgerOptions(store=store, legacy_keys=True))
            plain = EffectLedger(EffectLedgerOptions(store=store))
            for spec, recorded in ((FLOAT, {"w": 640}), (EVERY_ARG, "sent")):
                call = tool_call(spec)
                imported = await plain.find_by_idem_key(plain.idem_key(call))
                assert imported is None, "keyed differently here"
                assert await legacy.run(call, handler) == recorded
                assert (await legacy.begin(call)).cached_result == recorded
            assert ran == []
            # Every other imported call still replays with the option on.
            failed = ToolCall("wf-1", "refund", {"charge": "ch_9"})
            with pytest.raises(EffectFailedError):
                await legacy.run(failed, handler)
            # Without the option the two are new calls here, and run again.
            for spec in (FLOAT, EVERY_ARG):
                assert await plain.run(tool_call(spec), handler) == "ran again"
            assert ran == ["resize", "notify"]
        finally:
            await store.close()

    asyncio.run(check())


def test_begin_on_an_imported_failed_effect_raises(
    scenario: list[dict[str, Any]], v021: V021, target: str
) -> None:
    """0.2.1's begin() returned a failed effect as cached; here it raises (the guide says so)."""
    import_json(v021.url, target)

    async def check() -> None:
        store = await open_store(target, create=False)
        try:
            ledger = EffectLedger(EffectLedgerOptions(store=store))
            with pytest.raises(EffectFailedError) as failed:
                await ledger.begin(ToolCall("wf-1", "refund", {"charge": "ch_9"}))
            assert (failed.value.message, failed.value.code) == ("card expired", "E42")
            # reopen() sends it back to run again; begin() then owns it.
            assert await ledger.reopen(failed.value.effect.idem_key, by="ops", reason="new card")
            begun = await ledger.begin(ToolCall("wf-1", "refund", {"charge": "ch_9"}))
            assert not begun.cached and begun.effect.attempt == 2
        finally:
            await store.close()

    asyncio.run(check())
