"""wait_timeout_ms bounds a wait on another process's transaction (issue 26, item 4).

Another process opens ``store.transaction()``, begins the key inside it and
holds it uncommitted (SQLite: with the file's write lock) for 4 s, then rolls
back. A plain ``run()`` here with ``wait_timeout_ms=500`` gets
``EffectTimeoutError`` within about 500 ms; another, cancelled while it waits,
ends within a slice; neither stores anything, and after the rollback the key
runs its handler once. Before the fix both waited the whole 4 s (measured
3.0 s of a 3 s hold on SQLite, PostgreSQL and MariaDB alike) and the
cancelled one left an effect behind (``ready``). The in-process versions are
in ``tests/contract/test_wait_timeout_bounds_waits_on_another_transaction.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from urllib.parse import urlencode

import pytest

from agent_ledger import Effect, RunOptions, ToolCall
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.stores.sqlite import SqliteStore
from tests.harness import DSN, StoreHarness, mysql_test_url

pytestmark = [pytest.mark.slow, pytest.mark.every_store]

WAIT_MS = 500
HOLD_S = 4.0
MARGIN_S = 0.6

HOLDER = """
import asyncio, sys
from agent_ledger import EffectLedger, EffectLedgerOptions, ToolCall
from agent_ledger.stores.url import open_store

async def main(url, tag, hold_s):
    store = await open_store(url)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    try:
        async with store.transaction() as tx:
            await ledger.begin(ToolCall(workflow_id="wf", tool="charge", args={"tag": tag}), tx=tx)
            print("held", flush=True)
            await asyncio.sleep(hold_s)
            raise KeyboardInterrupt  # roll back
    except KeyboardInterrupt:
        pass
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


def url_of(harness: StoreHarness) -> str:
    store = harness.store
    if isinstance(store, SqliteStore):
        return f"sqlite:///{store.path}"
    if isinstance(store, PostgresStore):
        return f"{DSN}?{urlencode({'schema': store.schema})}"
    if harness.kind == "mysql":
        return mysql_test_url()
    pytest.skip(f"{harness.kind}: no other process can open it")


async def held_elsewhere(url: str, tag: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, tag, str(HOLD_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 60)
    assert line.strip() == "held", holder.stderr.read() if holder.stderr else line
    return holder


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_another_processs_uncommitted_insert_bounds_the_wait(
    harness: StoreHarness, how: str
) -> None:
    url = url_of(harness)
    ledger = harness.ledger()
    call = ToolCall(workflow_id="wf", tool="charge", args={"tag": how})
    ran: list[str] = []
    holder = await held_elsewhere(url, how)
    try:
        began = time.monotonic()
        if how == "timeout":
            options = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=WAIT_MS))
            with pytest.raises(EffectTimeoutError):
                await asyncio.wait_for(ledger.run(call, lambda e: ran.append("x"), options), 30)
            assert time.monotonic() - began < WAIT_MS / 1000 + MARGIN_S
        else:
            waiter = asyncio.create_task(ledger.run(call, lambda e: ran.append("x")))
            await asyncio.sleep(0.3)
            assert not waiter.done()
            cancelled_at = time.monotonic()
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(waiter), 30)
            assert time.monotonic() - cancelled_at < MARGIN_S
        assert holder.poll() is None, "the other process's transaction is still open"
    finally:
        await asyncio.to_thread(holder.communicate, timeout=30)
    assert holder.returncode == 0
    assert ran == []
    assert await harness.store.find(ledger.idem_key(call)) is None

    def later(effect: Effect) -> str:
        ran.append("later")
        return "ok"

    assert await ledger.run(call, later) == "ok"
    assert ran == ["later"]
