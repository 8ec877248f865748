"""The steps every call makes run as server-side prepared statements, each prepared
once per connection; a caller's own SQL in ``store.transaction()`` keeps the text
protocol. Counted by the server, per session (``SHOW SESSION STATUS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_ledger import ToolCall
from agent_ledger.stores.mysql import MySQLStore
from agent_ledger.testing import build_ledger
from tests.harness import MySQLHarness, mysql_test_url


def _returning(value: str) -> Callable[[object], str]:
    return lambda effect: value


async def _statement_counts(cur: Any) -> dict[str, int]:
    await cur.execute("SHOW SESSION STATUS LIKE 'Com_stmt_%'")
    return {str(name): int(value) for name, value in await cur.fetchall()}


async def test_a_fresh_run_and_a_replay_are_three_prepared_statements(my: MySQLHarness) -> None:
    """On a store of one connection, after one call has prepared what it needs: a
    fresh run executes two prepared statements (begin, commit), a replay one (the
    read by key), and nothing is prepared again."""
    store = await MySQLStore.connect(mysql_test_url(), max_size=1)
    try:
        ledger = build_ledger(store)

        async def counts() -> dict[str, int]:
            async with store._pool.connection() as conn, conn.cursor() as cur:
                return await _statement_counts(cur)

        warm = ToolCall("wf-prepared", "send", {"i": 0})
        assert await ledger.run(warm, lambda e: "done") == "done"
        assert await ledger.run(warm, lambda e: "again") == "done"
        before = await counts()
        for i in range(1, 6):
            call = ToolCall("wf-prepared", "send", {"i": i})
            answer = f"answer {i}"
            assert await ledger.run(call, _returning(answer)) == answer
            assert await ledger.run(call, _returning("again")) == answer
        after = await counts()
    finally:
        await store.close()
    assert after["Com_stmt_execute"] - before["Com_stmt_execute"] == 5 * 3
    assert after["Com_stmt_prepare"] == before["Com_stmt_prepare"]


async def test_a_callers_own_statements_in_a_transaction_use_the_text_protocol(
    my: MySQLHarness,
) -> None:
    """Inside store.transaction() the caller's positional statements, and the store's
    steps given that tx, are sent as text, as on any asyncmy connection (a prepared
    statement reads FLOAT in binary: 1.1 would come back as 1.100000023841858)."""
    ledger = my.ledger()
    async with my.store.transaction() as tx, tx.cursor() as cur:
        before = await _statement_counts(cur)
        await cur.execute("SELECT CAST(%s AS FLOAT)", (1.1,))
        (value,) = await cur.fetchone()
        call = ToolCall("wf-text", "send", {"i": 1})
        assert await ledger.run(call, lambda e: "in tx", tx=tx) == "in tx"
        after = await _statement_counts(cur)
    assert value == 1.1
    assert after["Com_stmt_execute"] == before["Com_stmt_execute"]
    assert after["Com_stmt_prepare"] == before["Com_stmt_prepare"]
    assert await ledger.run(call, lambda e: "again") == "in tx"
