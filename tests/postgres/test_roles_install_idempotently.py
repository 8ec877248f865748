"""`agent-ledger init --roles` and `store.install_roles()`: the role set is made
once, re-running it changes nothing but what it is told, and bad input
(a prefix that is no role name, a schema without tables, a SQLite URL) is
refused with a clear error before anything is created."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agent_ledger.errors import (
    EffectLedgerPermissionError,
    EffectLedgerValidationError,
    EffectStoreError,
)
from agent_ledger.stores._postgres_roles import role_names
from agent_ledger.stores.postgres import PostgresStore
from tests.harness import DSN, require_postgres


@pytest.fixture
async def fresh() -> AsyncIterator[tuple[str, str]]:
    """A schema name and a role prefix nobody uses; both dropped afterwards."""
    require_postgres()
    suffix = uuid.uuid4().hex[:8]
    schema, prefix = f"agent_ledger_install_{suffix}", f"al_{suffix}_"
    try:
        yield schema, prefix
    finally:
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
            for role in role_names(prefix):
                await conn.execute(
                    sql.SQL(
                        "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {}) THEN"
                        " EXECUTE 'DROP OWNED BY ' || quote_ident({}) || '';"
                        " EXECUTE 'DROP ROLE ' || quote_ident({}); END IF; END $$"
                    ).format(sql.Literal(role), sql.Literal(role), sql.Literal(role))
                )


async def _roles_like(prefix: str) -> list[tuple[str, bool]]:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT rolname, rolcanlogin FROM pg_roles WHERE starts_with(rolname, %s)"
            " ORDER BY rolname",
            (prefix,),
        )
        return [(str(name), bool(login)) for name, login in await cursor.fetchall()]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_ledger", "init", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_init_roles_from_the_command_line_and_again(fresh: tuple[str, str]) -> None:
    schema, prefix = fresh
    url = f"{DSN}?schema={schema}"
    made = await asyncio.to_thread(
        _cli, "--url", url, "--roles", "--role-prefix", prefix, "--separate-duty"
    )
    assert made.returncode == 0, made.stderr
    owner, worker, approver = role_names(prefix)
    assert f"approver {approver}" in made.stdout and "separation of duty on" in made.stdout
    assert f"GRANT {worker} TO" in made.stdout
    assert await _roles_like(prefix) == [(approver, False), (owner, False), (worker, False)]
    # Again without the flag: nothing changes, the setting stays.
    again = await asyncio.to_thread(_cli, "--url", url, "--roles", "--role-prefix", prefix)
    assert again.returncode == 0, again.stderr
    assert "separation of duty on" in again.stdout
    off = await asyncio.to_thread(
        _cli, "--url", url, "--roles", "--role-prefix", prefix, "--no-separate-duty"
    )
    assert off.returncode == 0 and "separation of duty off" in off.stdout
    store = await PostgresStore.connect(DSN, schema=schema, min_size=1, max_size=1)
    try:
        installed = await store.installed_roles()
        assert installed is not None and installed.approver == approver
        assert not installed.separate_duty
        # The owner role owns every table of the ledger in the schema.
        async with await psycopg.AsyncConnection.connect(DSN) as conn:
            cursor = await conn.execute(
                "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = %s", (schema,)
            )
            assert await cursor.fetchall() == [(owner,)]
    finally:
        await store.close()


async def test_bad_input_is_refused_and_creates_nothing(
    fresh: tuple[str, str], tmp_path: Path
) -> None:
    schema, prefix = fresh
    store = await PostgresStore.connect(DSN, schema=schema, min_size=1, max_size=1)
    try:
        # No tables yet: refused with the command that makes them.
        with pytest.raises(EffectStoreError, match="agent-ledger init"):
            await store.install_roles(prefix=prefix)
        assert await _roles_like(prefix) == []
        assert await store.installed_roles() is None
        await store.create_schema()
        for bad in ("Upper_", "x; DROP ROLE postgres; --", "", "a" * 60, "1abc_"):
            with pytest.raises(EffectLedgerValidationError, match="role prefix") as refused:
                await store.install_roles(prefix=bad)
            assert refused.value.field == "role_prefix"
        with pytest.raises(EffectLedgerValidationError, match="separate_duty"):
            await store.install_roles(prefix=prefix, separate_duty="yes")  # type: ignore[arg-type]
        assert await _roles_like(prefix) == []
        assert await store.installed_roles() is None
    finally:
        await store.close()
    sqlite = await asyncio.to_thread(_cli, "--url", f"sqlite:///{tmp_path}/l.db", "--roles")
    assert sqlite.returncode != 0 and "trust the process" in sqlite.stderr
    lonely = await asyncio.to_thread(_cli, "--url", f"{DSN}?schema={schema}", "--separate-duty")
    assert lonely.returncode != 0 and "go with --roles" in lonely.stderr


async def test_roles_installed_after_partitioning_guard_every_partition(
    fresh: tuple[str, str],
) -> None:
    schema, prefix = fresh
    store = await PostgresStore.connect(
        DSN, schema=schema, min_size=1, max_size=1, partitioned=True
    )
    try:
        await store.create_schema()
        await store.install_roles(prefix=prefix)
        async with await psycopg.AsyncConnection.connect(DSN) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FILTER (WHERE t.tgname IS NULL), count(*) FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid"
                " LEFT JOIN pg_trigger t ON t.tgrelid = c.oid"
                " AND t.tgname = 'agent_ledger_effects_decision_guard'"
                " WHERE i.inhparent = to_regclass(%s)",
                (f'"{schema}".agent_ledger_effects',),
            )
            unguarded, partitions = await cursor.fetchone() or (None, None)
        assert partitions and partitions >= 2 and unguarded == 0
    finally:
        await store.close()


async def test_installing_without_the_right_to_create_roles_says_what_it_needs(
    fresh: tuple[str, str],
) -> None:
    schema, prefix = fresh
    login = prefix + "installer"
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
    try:
        admin = await PostgresStore.connect(DSN, schema=schema, min_size=1, max_size=1)
        try:
            await admin.create_schema()
        finally:
            await admin.close()
        weak = await PostgresStore.connect(
            make_conninfo(DSN, user=login), schema=schema, min_size=1, max_size=1
        )
        try:
            with pytest.raises(EffectLedgerPermissionError, match="CREATEROLE") as refused:
                await weak.install_roles(prefix=prefix)
            assert refused.value.operation == "install_roles"
        finally:
            await weak.close()
        assert await _roles_like(prefix) == [(login, True)]
    finally:
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(login)))
            await conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))
