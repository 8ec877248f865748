"""PostgreSQL-only tests: skipped without a server, failed instead under CI's flag."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.harness import (
    DSN,
    TEST_SCHEMA,
    PostgresHarness,
    ensure_test_schema,
    open_harness,
    require_postgres,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg() -> AsyncIterator[PostgresHarness]:
    """A clean PostgresStore in this session's schema, plus its back door."""
    require_postgres()
    async with open_harness("postgres") as harness:
        assert isinstance(harness, PostgresHarness)
        yield harness


@pytest.fixture
async def schema() -> str:
    """The name of this session's (created) test schema."""
    require_postgres()
    await ensure_test_schema()
    return TEST_SCHEMA


@pytest.fixture
def dsn() -> str:
    """The test DSN, once a server is known to answer there (else skip or fail)."""
    require_postgres()
    return DSN
