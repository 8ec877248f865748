"""Run the real `agent-ledger` console script in a subprocess, against real stores."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import DSN, require_postgres

SCRIPT = shutil.which("agent-ledger", path=str(Path(sys.executable).parent)) or "agent-ledger"


@dataclass
class Cli:
    url: str
    cwd: Path

    def __call__(
        self, *args: str, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("AGENT_LEDGER_URL", "NO_COLOR")}
        return subprocess.run(
            [SCRIPT, "--url", self.url, *args],
            cwd=self.cwd,
            env=env,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    """The CLI pointed at a fresh store of each kind (schema created by `init`)."""
    if request.param == "sqlite":
        yield Cli(f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path)
        return
    require_postgres()
    schema = f"agent_ledger_cli_{uuid.uuid4().hex[:12]}"
    try:
        yield Cli(f"{DSN}?schema={schema}", tmp_path)
    finally:
        import psycopg
        from psycopg import sql

        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """The console script with explicit environment, for URL-less invocations."""

    def run(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )

    return run
