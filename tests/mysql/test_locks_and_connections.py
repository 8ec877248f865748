"""Row locks, bounded waits inside a caller's transaction, and connections the server killed."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from agent_ledger import RunOptions, ToolCall
from agent_ledger.errors import EffectInFlightError
from agent_ledger.options import ConcurrencyOptions
from tests.harness import TEST_DATABASE, MySQLHarness, mysql_backdoor

CALL = ToolCall("wf", "send", {"to": "a"})
BOUNDED = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=200))


async def test_a_begin_behind_anothers_uncommitted_insert_waits_its_bound_then_gives_up(
    my: MySQLHarness,
) -> None:
    """Inside a caller's transaction, begin waits for another transaction's lock at
    most the bound (whole seconds), then raises EffectInFlightError; the caller's
    transaction stays usable and commits its own work."""
    ledger = my.ledger()
    async with my.store.transaction() as holder:
        await ledger.run(CALL, lambda e: "first", tx=holder)  # uncommitted insert of the key
        started = time.monotonic()
        async with my.store.transaction() as other:
            with pytest.raises(EffectInFlightError):
                await ledger.run(CALL, lambda e: "second", BOUNDED, tx=other)
            waited = time.monotonic() - started
            other_call = ToolCall("wf", "send", {"to": "b"})
            assert await ledger.run(other_call, lambda e: "b", tx=other) == "b"
    assert 0.9 <= waited < 5, "rounded up to one whole second, not the server's 50 s"
    assert await ledger.run(CALL, lambda e: "again") == "first"
    assert await ledger.run(ToolCall("wf", "send", {"to": "b"}), lambda e: "x") == "b"


async def _kill_store_connections() -> int:
    """KILL CONNECTION every session on this session's database but the killer's own."""
    killer = await mysql_backdoor()
    try:
        async with killer.cursor() as cur:
            await cur.execute(
                "SELECT id FROM information_schema.processlist"
                " WHERE db = %s AND id <> CONNECTION_ID()",
                (TEST_DATABASE,),
            )
            ids = [row[0] for row in await cur.fetchall()]
            for thread_id in ids:
                await cur.execute(f"KILL CONNECTION {int(thread_id)}")
        return len(ids)
    finally:
        killer.close()


async def test_steps_go_on_after_the_server_killed_every_connection(my: MySQLHarness) -> None:
    """After KILL CONNECTION of the store's sessions, a begin (safe to repeat) is
    tried again on a fresh connection, and a commit's lost reply is recognised by
    the ledger: the handler runs once, and the effect finishes."""
    ledger = my.ledger()
    await ledger.run(ToolCall("wf", "warm", {}), lambda e: 0)  # connections in the pool
    assert await _kill_store_connections() >= 1
    runs: list[int] = []

    def first(effect: object) -> str:
        runs.append(1)
        return "ok"

    assert await ledger.run(CALL, first) == "ok"
    assert runs == [1]

    async def killed_mid_handler(effect: object) -> str:
        await _kill_store_connections()  # the commit then meets dead connections
        runs.append(2)
        return "second"

    second = ToolCall("wf", "send", {"to": "second"})
    assert await ledger.run(second, killed_mid_handler) == "second"
    assert runs == [1, 2]
    found = await ledger.find_by_idem_key(ledger.idem_key(second))
    assert found is not None and found.result == "second" and found.executions == 1


async def test_a_cancelled_step_leaves_no_open_transaction_on_a_pooled_connection(
    my: MySQLHarness,
) -> None:
    """A step cancelled mid-statement closes its connection (the server rolls back),
    so the next step never finds itself inside someone's half-done transaction."""
    ledger = my.ledger()
    for delay in (0, 0.0005, 0.001, 0.002, 0.004):
        call = ToolCall("wf", "cancel", {"d": delay})
        task = asyncio.create_task(ledger.run(call, lambda e: "done"))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for conn in list(my.store._pool._idle):
        assert not conn.get_transaction_status()
    assert await ledger.run(ToolCall("wf", "after", {}), lambda e: "after") == "after"
