"""MariaDB under load with its connections killed (KILL CONNECTION of the store's sessions).

Expected, as for PostgreSQL (test_db_faults.py, whose load this reuses): each
caller gets its result or a clear EffectStoreError, and after a recovery pass
nothing is stuck in processing, no committed result is lost, and only calls
whose outcome could not be recorded ran twice.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

import pytest

from agent_ledger.stores.mysql import MySQLStore
from tests.harness import (
    TEST_DATABASE,
    ensure_test_database,
    mysql_backdoor,
    mysql_test_url,
    require_mysql,
)
from tests.reliability.conftest import report
from tests.reliability.test_db_faults import Load

pytestmark = [pytest.mark.mysql, pytest.mark.slow]


async def kill_store_sessions(killer: Any) -> int:
    """KILL CONNECTION every session on this test session's database but the killer's."""
    async with killer.cursor() as cur:
        await cur.execute(
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
            (TEST_DATABASE,),
        )
        ids = [int(row[0]) for row in await cur.fetchall()]
        killed = 0
        for thread_id in ids:
            try:
                await cur.execute(f"KILL CONNECTION {thread_id}")
                killed += 1
            except Exception:  # it ended on its own meanwhile
                continue
        return killed


async def test_connections_killed_during_load(rng: random.Random) -> None:
    """KILL CONNECTION every 100 ms hits begin, commit, claims, heartbeats (every tenth
    handler runs 250 ms, past a heartbeat) and the duplicate-count flushes."""
    require_mysql()
    await ensure_test_database()
    store = await MySQLStore.connect(mysql_test_url(), max_size=10)
    killer = await mysql_backdoor()
    load = Load(cast(Any, store), f"kill-{rng.randrange(1 << 30)}")
    n = 300
    keys = [rng.randrange(n) for _ in range(n + n // 5)]  # every key once, some twice
    keys = list(range(n)) + keys[: n // 5]
    rng.shuffle(keys)
    killed = 0
    stop = asyncio.Event()

    async def chaos() -> None:
        nonlocal killed
        while not stop.is_set():
            await asyncio.sleep(0.1)
            killed += await kill_store_sessions(killer)

    try:
        chaos_task = asyncio.create_task(chaos())
        await load.run(keys, 16)
        stop.set()
        await chaos_task
        errors_during_chaos = sum(load.store_errors.values())
        errors_recovering = await load.recover(n)
        figures = await load.check(n)
    finally:
        await store.close()
        killer.close()
    assert killed > 0
    report(
        "connections killed under load (mysql)",
        calls=len(keys),
        connections_killed=killed,
        store_errors_seen=errors_during_chaos,
        store_errors_while_recovering=errors_recovering,
        **figures,
    )
