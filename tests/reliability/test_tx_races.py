"""Transactions under load: ``tx=`` callers racing plain workers on the same keys.

Plain workers call ``run(call, handler)``; transaction callers open
``store.transaction()``, run one to three keys inside it with ``tx=tx`` (keys
in sorted order, as an application must to avoid deadlocks of its own) and
commit. Both ask for every key, in shuffled orders, all at once; some
handlers outlive a heartbeat interval. Inside a transaction the ledger never
waits for an effect held elsewhere: such a call raises
``EffectInFlightError`` (documented) and the caller carries on.

Checked on every store, with real clocks (takeover is live): one execution
per key (an execution inside a transaction that rolled back was undone with
it and does not count), every effect terminal, every caller told the
receipt's result, no error other than ``EffectInFlightError``, and no
deadlock or hang: the whole test is bounded.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectStatus,
    MemoryStore,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.errors import EffectInFlightError
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.stores.base import Store
from agent_ledger.testing import build_ledger
from tests.harness import (
    DSN,
    STORE_KINDS,
    TEST_SCHEMA,
    ensure_test_database,
    ensure_test_schema,
    mysql_test_url,
    require_mysql,
    require_postgres,
)
from tests.reliability.conftest import report

pytestmark = pytest.mark.slow
KEYS = 300
PLAIN_WORKERS, TX_CALLERS = 12, 6
#: Each plain worker's queue holds every key this many times (over all workers).
PLAIN_ROUNDS = 2
LEASE_MS = 1_000
TIMEOUT_S = 90.0
OPTIONS = RunOptions(
    stale=StaleOptions(after_ms=LEASE_MS),
    concurrency=ConcurrencyOptions(
        wait_timeout_ms=30_000, initial_interval_ms=10, max_interval_ms=200
    ),
)


@asynccontextmanager
async def real_clock_store(kind: str) -> AsyncIterator[Store]:
    """A store judging leases by the real clock (the shared harness uses a manual one)."""
    if kind == "memory":
        yield MemoryStore()
    elif kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="agent-ledger-") as folder:
            sqlite = SqliteStore(Path(folder) / "ledger.db")
            try:
                yield sqlite
            finally:
                await sqlite.close()
    elif kind == "mysql":
        require_mysql()
        await ensure_test_database()
        from agent_ledger.stores.mysql import MySQLStore

        my = await MySQLStore.connect(mysql_test_url(), max_size=10)
        try:
            yield my
        finally:
            await my.close()
    else:
        require_postgres()
        await ensure_test_schema()
        from agent_ledger.stores.postgres import PostgresStore

        pg = await PostgresStore.connect(DSN, schema=TEST_SCHEMA, min_size=2, max_size=10)
        try:
            yield pg
        finally:
            await pg.close()


class Race:
    """Who ran what, inside which transaction, and what every caller was told."""

    def __init__(self, store: Store, rng: random.Random) -> None:
        self.store = store
        self.ledger: EffectLedger = build_ledger(store, defaults=OPTIONS)
        self.rng = rng
        self.workflow = f"tx-race-{uuid.uuid4().hex[:8]}"
        #: (key, transaction number or None) of every handler execution.
        self.executions: list[tuple[int, int | None]] = []
        self.rolled_back: set[int] = set()
        self.results: dict[int, list[Any]] = {}
        self.in_flight = 0
        self.errors: Counter[str] = Counter()
        self.transactions = 0

    def call(self, key: int) -> ToolCall:
        return ToolCall(workflow_id=self.workflow, tool="ledger.post", args={"key": key})

    def handler(self, key: int, tx_number: int | None) -> Any:
        async def post(effect: Effect) -> dict[str, int]:
            self.executions.append((key, tx_number))
            if tx_number is not None:
                await asyncio.sleep(self.rng.uniform(0, 0.01))  # holds the transaction
            elif key % 10 == 0:
                await asyncio.sleep(0.45)  # past a heartbeat interval (lease / 3)
            else:
                await asyncio.sleep(self.rng.uniform(0, 0.02))
            return {"key": key}

        return post

    async def plain_worker(self, queue: list[int]) -> None:
        while queue:
            key = queue.pop()
            try:
                result = await self.ledger.run(self.call(key), self.handler(key, None))
            except Exception as exc:
                self.errors[f"plain: {type(exc).__name__}"] += 1
                continue
            self.results.setdefault(key, []).append(result)

    async def tx_caller(self, batches: list[list[int]]) -> None:
        while batches:
            batch = batches.pop()
            self.transactions += 1
            number = self.transactions
            told: list[tuple[int, Any]] = []
            try:
                async with self.store.transaction() as tx:
                    for key in batch:
                        try:
                            told.append(
                                (key, await self.ledger.run(
                                    self.call(key), self.handler(key, number), tx=tx
                                ))
                            )  # fmt: skip
                        except EffectInFlightError:
                            self.in_flight += 1  # held elsewhere: documented, move on
            except Exception as exc:
                self.errors[f"tx: {type(exc).__name__}"] += 1
                self.rolled_back.add(number)
                continue
            for key, result in told:
                self.results.setdefault(key, []).append(result)


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_tx_callers_race_plain_workers(kind: str, rng: random.Random) -> None:
    """One execution per key, nothing lost, no error but EffectInFlightError, no hang."""
    async with real_clock_store(kind) as store:
        race = Race(store, rng)
        plain = [k for k in range(KEYS) for _ in range(PLAIN_ROUNDS)]
        rng.shuffle(plain)
        tx_keys = list(range(KEYS))
        rng.shuffle(tx_keys)
        batches: list[list[int]] = []
        while tx_keys:
            size = rng.randint(1, 3)
            batches.append(sorted(tx_keys[:size]))
            del tx_keys[:size]
        started = time.monotonic()
        async with asyncio.timeout(TIMEOUT_S):
            await asyncio.gather(
                *(race.plain_worker(plain) for _ in range(PLAIN_WORKERS)),
                *(race.tx_caller(batches) for _ in range(TX_CALLERS)),
            )
            elapsed = time.monotonic() - started
            effects = [
                await race.ledger.find_by_idem_key(race.ledger.idem_key(race.call(k)))
                for k in range(KEYS)
            ]
    kept = Counter(k for k, tx in race.executions if tx not in race.rolled_back)
    undone = sum(1 for _, tx in race.executions if tx in race.rolled_back)
    lost = [k for k, e in enumerate(effects) if e is None or e.status is not EffectStatus.SUCCEEDED]
    mismatched = [
        k
        for k, e in enumerate(effects)
        if e is not None and any(r != e.result for r in race.results.get(k, []))
    ]
    twice = sorted(k for k, n in kept.items() if n > 1)
    report(
        f"tx= callers racing workers ({kind})",
        keys=KEYS,
        plain_calls=KEYS * PLAIN_ROUNDS,
        transactions=race.transactions,
        executions=len(race.executions),
        executions_in_transactions=sum(1 for _, tx in race.executions if tx is not None),
        undone_by_rollback=undone,
        executed_twice=len(twice),
        in_flight_errors=race.in_flight,
        other_errors=dict(race.errors),
        lost=len(lost),
        results_mismatched=len(mismatched),
        seconds=round(elapsed, 1),
    )
    assert twice == [], f"ran twice: keys {twice}"
    assert (lost, mismatched) == ([], [])
    assert not race.errors, f"errors other than EffectInFlightError: {dict(race.errors)}"
    assert all(kept[k] == 1 for k in range(KEYS))
