"""Round trips per ledger step, counted on the wire (libpq trace), not assumed.

Every frontend `Query` (simple protocol) or `Execute` (extended protocol)
message is one statement sent to the server; BEGIN and COMMIT would show up
as `Query` messages too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from agent_ledger import Effect, EffectLedger, EffectStatus, RunOptions, ToolCall
from agent_ledger.effects import CommitSucceeded
from agent_ledger.options import StaleOptions
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import FaultyStore, StatementCounter, build_ledger
from tests.approvals import make_pending


@pytest.fixture(params=[True, False], ids=["autocommit-pool", "transactional-pool"])
async def traced(
    request: pytest.FixtureRequest, tmp_path: Path, dsn: str, schema: str, pg: Any
) -> AsyncIterator[tuple[EffectLedger, StatementCounter, PostgresStore]]:
    """A ledger on a one-connection pool whose every message is traced to a file.

    Traced from the connection class, not the pool's ``configure``, so the
    store's own heartbeat connection (made from the pool's connection class)
    is counted too.
    """
    wire = StatementCounter(tmp_path / "libpq.trace")

    class Traced(AsyncConnection[Any]):
        @classmethod
        async def connect(cls, *args: Any, **kwargs: Any) -> Traced:
            conn = await super().connect(*args, **kwargs)
            await wire.attach(conn)
            return conn

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        kwargs={"autocommit": request.param},
        connection_class=Traced,
        open=False,
    )
    await pool.open(wait=True)
    store = PostgresStore(pool, schema=schema)
    # after_ms=0: no heartbeat timer can add a statement to the count.
    ledger = build_ledger(store, defaults=RunOptions(stale=StaleOptions(after_ms=0)))
    try:
        yield ledger, wire, store
    finally:
        await store.close()
        await pool.close()
        wire.close()


CALL = ToolCall(workflow_id="wf", tool="count.me", args={"x": 1})


async def count(wire: StatementCounter, step: Callable[[], Any]) -> list[str]:
    wire.mark()
    await step()
    return wire.statements()


async def test_fresh_run_is_two_statements_and_replay_one(
    traced: tuple[EffectLedger, StatementCounter, PostgresStore],
) -> None:
    """A fresh run() costs begin + commit; a replay costs begin; never a BEGIN/COMMIT.

    The ledger's very first call also reads the schema version, once.
    """
    ledger, wire, _ = traced
    start = len(wire.lines())
    first = await count(wire, lambda: ledger.run(CALL, lambda e: {"ok": 1}))
    assert len(first) == 3, first
    # (sent with a parameter: the trace shows its text with the Parse, not the Execute)
    assert any("agent_ledger_schema_version" in line for line in wire.lines()[start:])
    replay = await count(wire, lambda: ledger.run(CALL, lambda e: {"ok": 2}))
    assert len(replay) == 1, replay
    for _ in range(6):  # after psycopg starts preparing statements, still the same
        assert len(await count(wire, lambda: ledger.run(CALL, lambda e: 0))) == 1
    other = ToolCall(workflow_id="wf", tool="count.me", args={"x": 2})
    assert len(await count(wire, lambda: ledger.run(other, lambda e: 0))) == 2
    assert not [line for line in wire.lines() if "BEGIN" in line or "COMMIT" in line]


async def test_each_manual_and_admin_step_is_one_statement(
    traced: tuple[EffectLedger, StatementCounter, PostgresStore],
) -> None:
    """begin, commit, heartbeat, cancel, get, find: one each; audited decisions: see below."""
    ledger, wire, _ = traced
    await ledger.stats()  # the first call reads the schema version; counted in the test above
    begun = None

    async def begin() -> None:
        nonlocal begun
        begun = await ledger.begin(CALL)

    assert len(await count(wire, begin)) == 1
    assert begun is not None
    effect = begun.effect
    assert len(await count(wire, lambda: ledger.heartbeat(effect.id, effect.attempt))) == 1
    assert len(await count(wire, lambda: ledger.cancel(effect.idem_key))) == 1
    assert len(await count(wire, lambda: ledger.get_effect(effect.id))) == 1
    assert len(await count(wire, lambda: ledger.find_by_idem_key(effect.idem_key))) == 1
    second = await ledger.begin(ToolCall(workflow_id="wf", tool="other"))
    step = lambda: ledger.commit(second.effect.id, CommitSucceeded(result=1), attempt=1)  # noqa: E731
    assert len(await count(wire, step)) == 1
    pending = await make_pending(ledger, ToolCall(workflow_id="wf", tool="third"))
    # A decision is audited (issue 28): two reads (the effect, its request: what
    # the decision is bound to), then one transaction holding the settle and its
    # audit row, so neither lands without the other.
    for decide in (ledger.approve, ledger.deny):
        if decide == ledger.deny:
            # Taking an approval back is a new request: read, record it, then move.
            taken_back = await count(wire, lambda: ledger.request_approval(pending.idem_key))
            assert len(taken_back) == 3, taken_back
        decided = await count(wire, lambda: decide(pending.idem_key))  # noqa: B023
        assert len(decided) == 6, decided
        assert ["BEGIN" in line for line in decided] == [False, False, True, False, False, False]
        assert "COMMIT" in decided[-1]


async def test_one_heartbeat_statement_per_tick_for_every_running_handler(
    traced: tuple[EffectLedger, StatementCounter, PostgresStore],
) -> None:
    """Five handlers alive for about five ticks cost about five statements, not 25."""
    ledger, wire, _ = traced
    options = RunOptions(stale=StaleOptions(after_ms=600))  # a tick every 200 ms
    release = asyncio.Event()
    started = 0

    async def long_job(effect: Effect) -> int:
        nonlocal started
        started += 1
        await release.wait()
        return effect.attempt

    calls = [ToolCall(workflow_id="wf", tool="tick", args={"n": n}) for n in range(5)]
    runs = [asyncio.create_task(ledger.run(call, long_job, options)) for call in calls]
    while started < len(calls):
        await asyncio.sleep(0.005)
    wire.mark()
    await asyncio.sleep(1.1)
    ticks = wire.count()
    release.set()
    assert await asyncio.gather(*runs) == [1] * len(calls)
    assert 4 <= ticks <= 7, ticks


async def test_begin_inside_a_transaction_adds_two_round_trips_to_bound_lock_waits(
    traced: tuple[EffectLedger, StatementCounter, PostgresStore],
) -> None:
    """Inside store.transaction(), begin sends its statement between a savepoint that sets
    lock_timeout (one message) and one that restores and releases it: three in all."""
    ledger, wire, store = traced
    await ledger.run(CALL, lambda e: "done")
    other = ToolCall(workflow_id="wf", tool="count.me", args={"x": 3})
    async with store.transaction() as tx:
        replay = await count(wire, lambda: ledger.run(CALL, lambda e: 0, tx=tx))
        fresh = await count(wire, lambda: ledger.begin(other, tx=tx))
    assert (len(replay), len(fresh)) == (3, 3), (replay, fresh)


async def test_a_run_cancelled_mid_begin_sends_begin_then_release(
    traced: tuple[EffectLedger, StatementCounter, PostgresStore],
) -> None:
    """Giving the effect back costs one statement, and only on that path: the
    begin (awaited to its end) and the release, nothing else."""
    ledger, wire, _ = traced
    await ledger.stats()  # the first call reads the schema version
    store = FaultyStore(ledger.store)
    store.slow("begin", seconds=0.1)
    slowed = build_ledger(store, defaults=RunOptions(stale=StaleOptions(after_ms=0)))
    await slowed.stats()
    wire.mark()
    run = asyncio.create_task(slowed.run(CALL, lambda e: 0))
    while store.calls["begin"] == 0:
        await asyncio.sleep(0.001)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    sent = wire.statements()
    assert len(sent) == 2, sent
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.READY
