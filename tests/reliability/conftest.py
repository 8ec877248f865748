"""Reliability tests: faults, crashes, load and bad input (marked `slow`)."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.harness import StoreHarness

#: Every figure a reliability test reports lands here too, for docs/reliability.md.
FIGURES = (
    Path(os.environ.get("AGENT_LEDGER_FIGURES", ""))
    if os.environ.get("AGENT_LEDGER_FIGURES")
    else None
)


@pytest.fixture
def rng() -> random.Random:
    """A seeded random source; the seed is printed so a failure can be replayed."""
    seed = int(os.environ.get("AGENT_LEDGER_SEED", random.randrange(1 << 30)))
    print(f"AGENT_LEDGER_SEED={seed}")
    return random.Random(seed)


def report(scenario: str, **figures: Any) -> None:
    """Print a scenario's figures (and append them to $AGENT_LEDGER_FIGURES if set)."""
    print(f"RELIABILITY {scenario}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    if FIGURES is not None:
        with FIGURES.open("ab") as file:
            file.write(orjson.dumps({"scenario": scenario, **figures}) + b"\n")


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
async def sql_server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[StoreHarness, str]]:
    """A clean store on each SQL server (PostgreSQL, MariaDB/MySQL), and the URL worker
    processes open the same tables with."""
    from tests.harness import DSN, TEST_SCHEMA, mysql_test_url, open_harness

    kind = request.param
    async with open_harness(kind) as harness:
        yield harness, (f"{DSN}?schema={TEST_SCHEMA}" if kind == "postgres" else mysql_test_url())
