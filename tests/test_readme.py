"""Every Python snippet in the README runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import DSN, require_postgres

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets() -> None:
    """The extraction works, so the parametrized test below is not vacuous."""
    assert len(SNIPPETS) >= 5


README_SCHEMA = "agent_ledger_readme"


def _drop_readme_schema() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(README_SCHEMA))
        )


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index: int, tmp_path: Path) -> None:
    """Each ```python block runs in a fresh interpreter without error (twice for Postgres)."""
    snippet = SNIPPETS[index]
    needs_postgres = "PostgresStore" in snippet
    if needs_postgres:
        require_postgres()
        assert README_SCHEMA in snippet
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(snippet)
    env = {**os.environ, "DATABASE_URL": DSN}
    try:
        for _ in range(2 if needs_postgres else 1):  # the second run replays from the database
            done = subprocess.run(
                [sys.executable, str(script)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
                env=env,
            )
            assert done.returncode == 0, f"snippet {index} failed:\n{snippet}\n{done.stderr}"
    finally:
        if needs_postgres:
            _drop_readme_schema()


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command is the one .ci/run executes."""
    ci = (README.parent / ".ci" / "run").read_text()
    assert re.search(r"^\s*pytest\b", README.read_text(), flags=re.M)
    assert re.search(r"^[^#\n]*\bpytest\b", ci, flags=re.M)
