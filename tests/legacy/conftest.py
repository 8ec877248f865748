"""A real agent-ledger 0.2.1, installed from PyPI into its own venv, writing real tables.

The venv lives in the system temp dir under a name keyed by the version, so
it is built once per machine; it is never a dependency of this project.
Each test gets fresh PostgreSQL schemas (dropped afterwards), named like the
rest of the suite's, so parallel runs never share one.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forkserver
from tests.harness import DSN, require_postgres

VERSION: str = "0.2.1"
WORKER = Path(__file__).with_name("v021_worker.py")
#: What v021_worker.py imports besides the standard library.
PRELOADED = ("agent_ledger", "agent_ledger.stores.postgres", "psycopg", "psycopg_pool")


def _venv_python() -> Path:
    home = Path(tempfile.gettempdir()) / f"agent-ledger-{VERSION}-venv"
    python = home / "bin" / "python"
    ready = home / ".ready"
    if ready.exists():
        return python
    # pytest-xdist workers (and parallel runs) may all find no venv at once: one
    # builds it while the others wait on the lock, then find it ready.
    with open(f"{home}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                f"agent-ledger=={VERSION}",
                "psycopg[binary,pool]",
            ],
            check=True,
        )
        ready.write_text(VERSION)
    return python


@pytest.fixture(scope="session")
def v021_python() -> Path:
    require_postgres()
    return _venv_python()


class V021:
    """Runs the 0.2.1 worker script against one schema."""

    def __init__(self, python: Path, schema: str) -> None:
        self.python = python
        self.schema = schema
        self.url = f"{DSN}?schema={schema}" if "?" not in DSN else f"{DSN}&schema={schema}"

    def call(self, command: str, stdin: object = None) -> Any:
        # Forked from a 0.2.1 interpreter that has imported what the worker
        # imports (tests/forkserver.py): a test makes several calls, and each
        # fresh interpreter would spend most of its time importing them again.
        done = forkserver.run(
            [WORKER, DSN, self.schema, command],
            cwd=WORKER.parent,
            input=json.dumps(stdin),
            timeout=120,
            python=str(self.python),
            preload=PRELOADED,
        )
        if done.returncode != 0:
            raise AssertionError(f"0.2.1 worker failed: {done.stderr}")
        return json.loads(done.stdout)

    def start_run(self, spec: dict[str, Any]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [str(self.python), str(WORKER), DSN, self.schema, "run"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdin is not None
        process.stdin.write(json.dumps(spec))
        process.stdin.close()
        return process


def _drop(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def schemas() -> Iterator[list[str]]:
    """Fresh schema names for this test; each is dropped afterwards."""
    made: list[str] = []
    yield made
    for schema in made:
        _drop(schema)


def new_schema(schemas: list[str], what: str) -> str:
    name = f"agent_ledger_test_{what}_{uuid.uuid4().hex[:10]}"
    schemas.append(name)
    return name


@pytest.fixture
def v021(v021_python: Path, schemas: list[str]) -> V021:
    """An empty schema that 0.2.1 will write to."""
    return V021(v021_python, new_schema(schemas, "v021"))


@pytest.fixture
def scenario(v021: V021) -> list[dict[str, Any]]:
    """0.2.1's table with one row of each kind; what each call was."""
    calls: list[dict[str, Any]] = v021.call("scenario")
    return calls
