"""Connecting by URL and the versioned schema: what fails says why, and what to run."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from importlib import resources

import pytest

from agent_ledger import EffectLedgerValidationError, EffectStoreError
from agent_ledger.stores.mysql import MYSQL_MIGRATIONS, MYSQL_SCHEMA_VERSION, MySQLStore
from agent_ledger.stores.url import open_store
from tests.harness import (
    MYSQL_URL,
    _root_sql,
    ensure_test_database,
    mysql_test_url,
    require_mysql,
)


def _url_for(database: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(MYSQL_URL)._replace(path="/" + database))


@pytest.fixture
async def empty_database() -> AsyncIterator[str]:
    """A database with no tables in it, dropped afterwards; its URL."""
    require_mysql()
    name = f"agent_ledger_empty_{uuid.uuid4().hex[:10]}"
    await _root_sql(f"CREATE DATABASE `{name}`")
    try:
        yield _url_for(name)
    finally:
        await _root_sql(f"DROP DATABASE IF EXISTS `{name}`")


def test_the_schema_files_record_the_version_the_library_needs() -> None:
    """mysql_schema.sql records version 3, each mysql_schema_<N>.sql records N, and
    the last of them is the version this library needs."""
    files = resources.files("agent_ledger.stores")
    recorded = []
    for name in ["mysql_schema.sql", *(f"mysql_schema_{n}.sql" for n in MYSQL_MIGRATIONS)]:
        recorded += re.findall(
            r"agent_ledger_schema_version \(version, applied_at\) VALUES \((\d+),",
            files.joinpath(name).read_text(),
        )
    assert recorded == [str(n) for n in range(3, MYSQL_SCHEMA_VERSION + 1)]
    assert MYSQL_SCHEMA_VERSION == 4


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("mysql://root@127.0.0.1:3306", "names no database"),
        ("mysql://root@127.0.0.1:3306/test?sslmode=x", "unknown MySQL URL parameter 'sslmode'"),
        ("mysql://root@[::1/test", "malformed MySQL URL"),
    ],
)
async def test_a_bad_url_is_refused_naming_the_field(url: str, fragment: str) -> None:
    with pytest.raises(EffectLedgerValidationError, match=re.escape(fragment)) as refused:
        await MySQLStore.connect(url)
    assert refused.value.field == "url"


async def test_an_unknown_database_fails_at_connect_with_the_servers_reason() -> None:
    require_mysql()
    with pytest.raises(EffectStoreError, match="Unknown database"):
        await MySQLStore.connect(_url_for(f"agent_ledger_missing_{uuid.uuid4().hex[:8]}"))


async def test_a_closed_port_fails_at_connect() -> None:
    with pytest.raises(EffectStoreError, match="cannot connect to MySQL"):
        await MySQLStore.connect("mysql://root@127.0.0.1:1/test", connect_timeout=5)


async def test_mariadb_and_mysql_urls_open_the_store() -> None:
    require_mysql()
    await ensure_test_database()
    for url in (mysql_test_url(), mysql_test_url().replace("mysql://", "mariadb://", 1)):
        store = await open_store(url)
        try:
            assert isinstance(store, MySQLStore)
            assert store.server.mariadb == ("mariadb" in store.server.version.lower())
        finally:
            await store.close()


async def test_migrate_creates_then_finds_nothing_to_do(empty_database: str) -> None:
    store = await MySQLStore.connect(empty_database)
    try:
        with pytest.raises(EffectStoreError, match="agent-ledger init"):
            await store.check_schema()
        with pytest.raises(EffectStoreError, match="tables are missing"):
            await store.find("k" * 64)
        first = await store.migrate()
        assert (first.from_version, first.to_version) == (0, MYSQL_SCHEMA_VERSION)
        again = await store.migrate()
        assert (again.from_version, again.to_version, again.changed) == (
            MYSQL_SCHEMA_VERSION,
            MYSQL_SCHEMA_VERSION,
            False,
        )
        assert await store.check_schema() == MYSQL_SCHEMA_VERSION
    finally:
        await store.close()


async def test_a_schema_from_a_newer_release_is_refused(empty_database: str) -> None:
    store = await MySQLStore.connect(empty_database)
    try:
        await store.create_schema()
        database = empty_database.rsplit("/", 1)[1]
        await _root_sql(
            f"INSERT INTO `{database}`.agent_ledger_schema_version VALUES (99, UTC_TIMESTAMP(6))"
        )
        with pytest.raises(EffectStoreError, match="newer than this library's"):
            await store.check_schema()
        with pytest.raises(EffectStoreError, match="newer than this library's"):
            await store.migrate()
    finally:
        await store.close()


async def test_names_too_long_for_their_key_are_refused_not_truncated(empty_database: str) -> None:
    store = await MySQLStore.connect(empty_database)
    try:
        await store.create_schema()
        from agent_ledger.stores.saga_base import NewSaga

        too_long = NewSaga(
            saga_id="s" * 513,
            owner="me",
            lease_ms=1000,
            abandon_after_ms=None,
            on_compensation_failure="continue",
        )
        with pytest.raises(EffectStoreError, match="Data too long"):
            await store.begin_saga(too_long)
        assert await store.list_sagas() == []
    finally:
        await store.close()


async def test_migrate_upgrades_a_version_3_database_to_4_and_keeps_every_effect(
    empty_database: str,
) -> None:
    """A database written by mysql_schema.sql as released at version 3 (the
    fixture), with an effect waiting for a person, is upgraded once; the effect
    is then decided with its audit row."""
    from agent_ledger.approvals import Channel, DecisionAction
    from agent_ledger.deciding import approval_store, decide, effect_intent
    from agent_ledger.status import EffectStatus
    from agent_ledger.stores.base import SchemaMigration
    from agent_ledger.stores.mysql import _statements
    from tests.schema_history import MYSQL_V3

    store = await MySQLStore.connect(empty_database)
    try:

        async def build(cur: object) -> None:
            for statement in _statements(MYSQL_V3, store.server.collation):
                await cur.execute(statement)  # type: ignore[attr-defined]
            await cur.execute(  # type: ignore[attr-defined]
                "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
                " args_canonical, created_at, updated_at, heartbeat_at, lease_ms, history)"
                " VALUES ('00000000-0000-4000-8000-000000000001', 'key-1', 'w', 'pay',"
                " 'requires_approval', '{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),"
                " UTC_TIMESTAMP(6), 15000, '[]')"
            )

        await store._run("test_setup", build, None, atomic=False)
        assert await store.migrate() == SchemaMigration(3, 4)
        assert await store.migrate() == SchemaMigration(4, 4)
        waiting = await store.find("key-1")
        assert waiting is not None and waiting.status is EffectStatus.REQUIRES_APPROVAL
        done = await decide(
            store,
            "key-1",
            action=DecisionAction.APPROVE,
            principal="alice",
            channel=Channel.CONSOLE,
            shown_intent=effect_intent(waiting, None),
        )
        assert done.accepted
        (row,) = await approval_store(store).decision_attempts("key-1")
        assert row.principal == "alice"
    finally:
        await store.close()
