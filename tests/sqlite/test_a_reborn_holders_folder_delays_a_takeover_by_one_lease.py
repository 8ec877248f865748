"""A holders folder that was deleted protects every holding in it for one lease,
and no longer (issue 26 follow-up, finding 3; see ``_sqlite_holders``).

A missing holder file counts as a holder that never showed life only in a
folder that has been there all along. After a deletion the first claim to
look writes the folder's ``.born`` marker, and until it is a lease old no
holding is taken over: a live holder's thread writes its file again within
a period. A holder that is really dead is taken over one lease later.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from agent_ledger.clock import ManualClock
from agent_ledger.stores import SqliteStore
from agent_ledger.stores.base import NewEffect

LEASE_MS = 1_000


def _new() -> NewEffect:
    return NewEffect(
        idem_key="k",
        workflow_id="wf",
        call_id=None,
        tool="t",
        args_canonical="{}",
        resource_id_canonical=None,
        lease_ms=LEASE_MS,
    )


async def test_a_deleted_folder_delays_a_takeover_by_one_lease(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "ledger.db"
    store = SqliteStore(path, clock=clock)
    holders = Path(f"{path}-holders")
    assert (holders / ".born").exists()  # written when the store opened
    await store.begin(_new())  # the holder, then silent
    shutil.rmtree(holders)
    clock.advance(ms=LEASE_MS + 1)
    assert not (await store.claim("k", stale_after_ms=LEASE_MS)).claimed
    assert (holders / ".born").exists()
    clock.advance(ms=LEASE_MS + 1)
    outcome = await store.claim("k", stale_after_ms=LEASE_MS)
    assert outcome.claimed and outcome.effect is not None and outcome.effect.attempt == 2
    await store.close()


async def test_a_folder_never_deleted_delays_nothing(tmp_path: Path) -> None:
    clock = ManualClock()
    store = SqliteStore(tmp_path / "ledger.db", clock=clock)
    await store.begin(_new())
    clock.advance(ms=LEASE_MS + 1)
    assert (await store.claim("k", stale_after_ms=LEASE_MS)).claimed
    await store.close()
