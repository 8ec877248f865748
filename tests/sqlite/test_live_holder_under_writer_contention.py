"""Other writers holding SQLite's write lock never get a live holder taken over.

Issue 26, item 1.
A heartbeat needs the write lock. While another writer holds it past the
lease, the holder's heartbeats cannot land and its stored heartbeat ages as
if it had died. The claim must still see that the holder is alive: the
holder keeps a second heartbeat outside the database (its file in
``<db>-holders/``), which needs no write lock.

Fast and deterministic: the "other writer" is a transaction of a second
store, and the takeover is attempted inside it, after it has held the write
lock for three leases; nothing there depends on who wins the lock next. The
attacks from other processes (killed transactions, streams of short ones, a
long purge) are in ``tests/reliability/test_writer_contention.py``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.options import StaleOptions
from agent_ledger.stores._sqlite_holders import GRACE_S
from agent_ledger.stores.base import Held, NewEffect

LEASE_MS = 300
CALL = ToolCall(workflow_id="wf", tool="payments.charge", args={"cents": 100})


def holder_files(folder: Path) -> list[str]:
    """The holders' files in ``folder`` (not its ``.born`` marker)."""
    return sorted(name for name in os.listdir(folder) if not name.startswith("."))


@pytest.mark.parametrize("spelling", ["same path", "symlink", "relative path"])
async def test_a_claim_after_a_long_hold_of_the_write_lock_leaves_a_live_holder(
    tmp_path: Path, spelling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each store names the file its own way: the holder's liveness file must
    # be found however the claimer spelled the path.
    path = tmp_path / "data" / "ledger.db"
    path.parent.mkdir()
    if spelling == "symlink":
        link = tmp_path / "link.db"
        link.symlink_to(path)
        store = SqliteStore(link)
    elif spelling == "relative path":
        monkeypatch.chdir(tmp_path)
        store = SqliteStore(Path("data") / "ledger.db")
    else:
        store = SqliteStore(path)
    other = SqliteStore(path)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    started, finish = asyncio.Event(), asyncio.Event()
    runs = 0

    async def charge(effect: object) -> str:
        nonlocal runs
        runs += 1
        started.set()
        await finish.wait()
        return "ch_1"

    options = RunOptions(stale=StaleOptions(after_ms=LEASE_MS))
    running = asyncio.create_task(ledger.run(CALL, charge, options))
    await started.wait()
    key = ledger.idem_key(CALL)
    try:
        async with other.transaction() as tx:
            # Three leases with the write lock held: no heartbeat lands.
            await asyncio.sleep(3 * LEASE_MS / 1000)
            stored = await other.find(key, tx=tx)
            assert stored is not None and stored.status is EffectStatus.PROCESSING
            outcome = await other.claim(key, stale_after_ms=LEASE_MS, tx=tx)
            assert not outcome.claimed, "a live holder was taken over"
    finally:
        finish.set()
    assert await running == "ch_1"
    assert runs == 1
    done = await other.find(key)
    assert done is not None and done.executions == 1 and done.attempt == 1
    await store.close()
    await other.close()


async def test_a_silent_holder_is_still_taken_over_after_its_lease(tmp_path: Path) -> None:
    # The other half of the rule: a holder that stopped (here: a begin and
    # one heartbeat with no run behind them, as after a crash) is taken over
    # once its lease, and the grace its last sign of life gave its file,
    # have passed; the takeover removes the old holder's file, and the new
    # holder's commit its own.
    path = tmp_path / "ledger.db"
    store = SqliteStore(path)
    new = NewEffect(
        idem_key="k",
        workflow_id="wf",
        call_id=None,
        tool="t",
        args_canonical="{}",
        resource_id_canonical=None,
        lease_ms=LEASE_MS,
    )
    first = (await store.begin(new)).effect
    await store.heartbeat([Held(first.id, 1)])
    holders = Path(f"{path}-holders")
    await asyncio.sleep(LEASE_MS / 1000)
    assert holder_files(holders) == [f"{first.id}.1"]  # kept fresh: the grace
    assert not (await store.claim("k", stale_after_ms=LEASE_MS)).claimed
    await asyncio.sleep(GRACE_S + 2 * LEASE_MS / 1000)
    outcome = await store.claim("k", stale_after_ms=LEASE_MS)
    assert outcome.claimed and outcome.effect is not None and outcome.effect.attempt == 2
    assert holder_files(holders) == []
    await store.commit(
        first.id, attempt=2, status=EffectStatus.SUCCEEDED, result_json="1", error=None
    )
    assert holder_files(holders) == []
    await store.close()
