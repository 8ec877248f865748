"""Fixtures shared by every test tier.

``harness`` is parametrized over every store, so each contract test runs
against each of them. A harness pairs a store with a back door (``age``,
``raw_count``) that does not go through the store's own API, so tests can
check what is really stored.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.harness import (
    DSN,
    REPRESENTATIVE_STORE,
    STORE_KINDS,
    TEST_SCHEMA,
    PostgresHarness,
    StoreHarness,
    drop_test_database,
    drop_test_schema,
    empty_tables,
    ensure_test_schema,
    open_harness,
    psycopg_installed,
    require_postgres,
)

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Bytecode caches on, whatever the shell says (PYTHONDONTWRITEBYTECODE=1): the
# xdist workers (started after this) and every interpreter a test starts (docs
# snippets, the console script, worker processes) then compile the package
# once per run instead of once per process: about 0.4 CPU-s per interpreter.
# The caches go to __pycache__/ folders, which git ignores.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Every PostgreSQL connection this test run makes (worker subprocesses too, which
# inherit the environment) carries one application_name, so fault tests that
# terminate backends terminate only this run's: never another run's on the same
# server. Under pytest-xdist each worker inherits the controller's name and adds
# its own id (gw0, gw1, ...), so a worker's fault tests never reach the other's.
os.environ.setdefault("PGAPPNAME", f"agent_ledger_tests_{os.getpid()}")
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["PGAPPNAME"] += f"_{os.environ['PYTEST_XDIST_WORKER']}"


#: xdist workers per core for `-n auto` (addopts): plain pytest spends about half
#: of each worker's time waiting (on PostgreSQL and MariaDB, on subprocesses, on
#: leases and deadlines that must pass in real time), so one worker a core
#: leaves the cores idle that long; two a core fill it, for the CPU-seconds of
#: one more collection a worker. PYTEST_XDIST_AUTO_NUM_WORKERS still overrides.
WORKERS_PER_CORE = 2


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return WORKERS_PER_CORE * (cores or 1)


@pytest.fixture(params=STORE_KINDS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[StoreHarness]:
    async with open_harness(request.param) as h:
        yield h


def _reliability_through_pgbouncer(item: pytest.Item) -> bool:
    """A reliability test on the PgBouncer harness: its long loops gain nothing
    from the pooler that the contract run through it does not show."""
    callspec = getattr(item, "callspec", None)
    return (
        "reliability" in item.path.parent.parts[-1:]
        and callspec is not None
        and callspec.params.get("harness") == "postgres-pgbouncer"
    )


#: Store kinds, as tests name them in their parameters.
_STORE_NAMES = frozenset(str(param.values[0]) for param in STORE_KINDS)
#: Folders whose store-parametrized tests run on every store in plain `pytest`:
#: the store contract, and the per-store unit checks of schema text.
_EVERY_STORE_FOLDERS = frozenset({"contract", "unit"})


def _runs_on_every_store(item: pytest.Item) -> bool:
    folder = item.path.parent.name
    return folder in _EVERY_STORE_FOLDERS or item.get_closest_marker("every_store") is not None


def _store_of(item: pytest.Item) -> str | None:
    """The store kind a parameter of this test chooses (`harness`, `cli`, ... = "sqlite")."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():
        if isinstance(value, str) and value in _STORE_NAMES:
            return value
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark what needs the server `postgres`, and choose the stores plain `pytest` runs.

    Every test under tests/postgres/ (tests/mysql/) needs the server (marked
    `postgres`, `mysql`). A store-parametrized test
    runs on every store kind (tests/harness.py STORE_KINDS, a new kind included)
    in plain `pytest` when it pins the store contract (tests/contract/, and the
    schema checks in tests/unit/) or is marked `every_store`. Any other such
    test (tools, sagas, replay, adapters, CLI) pins a feature above the Store
    protocol: plain `pytest` runs it on REPRESENTATIVE_STORE, and the other
    stores' runs are marked `slow`, so `pytest -m slow` still runs them.
    """
    dropped = [item for item in items if _reliability_through_pgbouncer(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not _reliability_through_pgbouncer(item)]
    for item in items:
        if "postgres" in item.path.parent.parts[-1:]:
            item.add_marker(pytest.mark.postgres)
        if "mysql" in item.path.parent.parts[-1:]:
            item.add_marker(pytest.mark.mysql)
        store = _store_of(item)
        if store is not None and store != REPRESENTATIVE_STORE and not _runs_on_every_store(item):
            item.add_marker(pytest.mark.slow)


#: A top-level import that needs the `postgres` extra.
_IMPORTS_PSYCOPG = re.compile(
    r"^(?:import|from)\s+(?:psycopg\w*|agent_ledger\.stores\.postgres)\b", re.MULTILINE
)


class _NeedsPsycopg(pytest.Module):
    """A test module that imports psycopg at the top, where psycopg is not installed.

    Importing it would be a collection error; instead it is skipped with the
    same reason as every other Postgres test (or, with
    AGENT_LEDGER_REQUIRE_POSTGRES=1, reported as an error), by the same check.
    """

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        require_postgres()  # always skips or fails here: psycopg is missing
        return super().collect()


def pytest_pycollect_makemodule(
    module_path: Path, parent: pytest.Collector
) -> pytest.Module | None:
    if psycopg_installed() or not _IMPORTS_PSYCOPG.search(module_path.read_text()):
        return None
    return _NeedsPsycopg.from_parent(parent, path=module_path)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests import forkserver
    from tests.pgbouncer import stop_pgbouncer

    forkserver.close_all()
    stop_pgbouncer()
    drop_test_schema()
    drop_test_database()


@pytest.fixture
async def pg() -> AsyncIterator[PostgresHarness]:
    """A clean PostgresStore in this session's schema, plus its back door."""
    require_postgres()
    async with open_harness("postgres") as harness:
        assert isinstance(harness, PostgresHarness)
        yield harness


@pytest.fixture
async def schema() -> str:
    """The name of this session's (created) test schema, emptied: what an earlier
    test on this worker stored there is gone, whichever test that was."""
    require_postgres()
    await ensure_test_schema()
    import psycopg

    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(empty_tables(TEST_SCHEMA))
    return TEST_SCHEMA


@pytest.fixture
def dsn() -> str:
    """The test DSN, once a server is known to answer there (else skip or fail)."""
    require_postgres()
    return DSN
