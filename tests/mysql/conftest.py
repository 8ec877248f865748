"""Fixtures for the MySQLStore's own tests (every test here is marked `mysql`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.harness import MySQLHarness, open_harness, require_mysql


@pytest.fixture
async def my() -> AsyncIterator[MySQLHarness]:
    """A clean MySQLStore in this session's database, plus its back door."""
    require_mysql()
    async with open_harness("mysql") as harness:
        assert isinstance(harness, MySQLHarness)
        yield harness
