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


SESSION = re.search(r"```console\n(.*?)```", README.read_text(), flags=re.S)
#: Parts of the output that differ on every run: times, durations, effect ids.
VOLATILE = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00"), "<time>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "<time>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\d+\.\d ms"), "<duration>"),
]


def _mask(text: str) -> str:
    for pattern, placeholder in VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def test_readme_cli_session_is_real_output(tmp_path: Path) -> None:
    """Replaying the README's console session in a fresh folder prints the same thing."""
    assert SESSION is not None
    steps = re.split(r"^\$ (.*)$", SESSION.group(1), flags=re.M)[1:]
    commands, expected = steps[0::2], steps[1::2]
    assert len(commands) >= 5
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_LEDGER_URL", "NO_COLOR")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    for command, output in zip(commands, expected, strict=True):
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert _mask(done.stdout) == _mask(output.removeprefix("\n")), command
