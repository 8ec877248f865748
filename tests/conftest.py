"""Fixtures shared by every test tier.

``harness`` is parametrized over every store, so each contract test runs
against each of them. A harness pairs a store with a back door (``age``,
``raw_count``) that does not go through the store's own API, so tests can
check what is really stored.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, settings

from tests.harness import STORE_KINDS, StoreHarness, drop_test_schema, open_harness

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(params=STORE_KINDS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[StoreHarness]:
    async with open_harness(request.param) as h:
        yield h


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    drop_test_schema()
