"""SqliteStore's steps called directly: honest error labels."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path

import pytest

from agent_ledger import EffectStatus, EffectStoreError
from agent_ledger.stores.sqlite import (
    SQLITE_MIGRATIONS,
    SQLITE_SCHEMA_SQL,
    SQLITE_SCHEMA_VERSION,
    SqliteStore,
)


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


def test_schema_version_constant_is_what_the_schema_records() -> None:
    """Each schema file records its own version, and the newest is the one needed."""
    scripts = {1: SQLITE_SCHEMA_SQL, **SQLITE_MIGRATIONS}
    for version, script in scripts.items():
        recorded = re.findall(
            r"INTO agent_ledger_schema_version \(version, applied_us\)\s+VALUES \((\d+),", script
        )
        assert [int(v) for v in recorded] == [version]
    assert max(scripts) == SQLITE_SCHEMA_VERSION


async def test_check_schema_names_the_fix(tmp_path: Path) -> None:
    """A missing or older schema says to run init; create_schema() fixes a store opened bare."""
    db = tmp_path / "ledger.db"
    sqlite3.connect(db).close()
    store = SqliteStore(db, create=True)
    try:
        assert await store.check_schema() == SQLITE_SCHEMA_VERSION
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("DELETE FROM agent_ledger_schema_version")
            conn.commit()
        with pytest.raises(
            EffectStoreError, match=rf"version None.*`agent-ledger init --url sqlite:///{db}`"
        ) as info:
            await store.check_schema()
        assert info.value.operation == "check_schema"
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("DROP TABLE agent_ledger_schema_version")
        with pytest.raises(EffectStoreError, match=r"no agent-ledger tables.*agent-ledger init"):
            await store.check_schema()
    finally:
        await store.close()
