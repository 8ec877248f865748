"""SqliteStore's steps called directly: honest error labels."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from agent_ledger import EffectStatus, EffectStoreError
from agent_ledger.stores.sqlite import SqliteStore


async def test_store_errors_name_the_step_not_the_target(tmp_path: Path) -> None:
    """A failing transition reports operation="transition", whatever the target."""
    store = SqliteStore(tmp_path / "ledger.db")
    try:
        with contextlib.closing(sqlite3.connect(tmp_path / "ledger.db")) as conn:
            conn.execute("DROP TABLE agent_ledger_effects")
        for target in (EffectStatus.READY, EffectStatus.CANCELED):
            with pytest.raises(EffectStoreError) as info:
                await store.transition("k" * 64, target=target)
            assert info.value.operation == "transition"
            assert info.value.idem_key == "k" * 64
        with pytest.raises(EffectStoreError) as info:
            await store.commit(
                "0b0e4f5e-1111-4222-8333-444455556666",
                attempt=1,
                status=EffectStatus.SUCCEEDED,
                result_json="1",
                error=None,
            )
        assert info.value.operation == "commit"
    finally:
        await store.close()
