"""CLI arguments a user got wrong are one clear line, never a traceback (issue 10, item 19);
`--url` after the command, `init` making its folder, and help on decision arguments."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.cli.conftest import run_in_process


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command's wording and exit code, from ``cli.main`` in this process."""
    return run_in_process(list(args), cwd)


@pytest.mark.parametrize("target", ["missing/dir/f.json", "."])
def test_export_to_a_bad_path_is_one_line_and_touches_nothing(tmp_path: Path, target: str) -> None:
    done = run("--url", "sqlite:///./ledger.db", "export", "-o", target, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert "--output" in done.stderr
    assert not (tmp_path / "ledger.db").exists()  # rejected before any store was opened


def test_url_is_accepted_after_the_command(tmp_path: Path) -> None:
    assert run("init", "--url", "sqlite:///./after.db", cwd=tmp_path).returncode == 0
    assert (tmp_path / "after.db").exists()
    done = run("--url", "sqlite:///./nowhere.db", "stats", "--url", "sqlite:///./after.db",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "nowhere.db").exists()  # the later --url wins


def test_init_create_dirs_creates_the_folder_that_list_asks_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'dir' / 'x.db'}"
    listed = run("--url", url, "list", cwd=tmp_path)
    assert listed.returncode == 1 and "agent-ledger init" in listed.stderr
    assert run("--url", url, "init", "--create-dirs", cwd=tmp_path).returncode == 0
    assert run("--url", url, "list", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("command", ["approve", "deny", "cancel"])
def test_decision_arguments_have_help(tmp_path: Path, command: str) -> None:
    done = run(command, "--help", cwd=tmp_path)
    assert done.returncode == 0
    assert "id, its key, or a key prefix" in done.stdout  # the KEY argument
    assert done.stdout.count("kept on the receipt") == 2  # --by and --note/--reason


@pytest.mark.parametrize(
    "args",
    [
        ["--url", "postgresql://[::1", "stats"],
        ["--url", "postgresql://[::1/db?schema=x", "list"],
        ["--url", "sqlite:///./ledger.db", "import-0.2", "--from", "postgresql://[::1"],
        ["--url", "postgresql://[::1", "import-0.2", "--from", "postgresql://u@h/db"],
    ],
)
def test_a_malformed_postgres_url_is_one_line(tmp_path: Path, args: list[str]) -> None:
    """urlsplit's ValueError ("Invalid IPv6 URL") is a usage error naming the URL."""
    if "import-0.2" in args and args[1].startswith("sqlite"):
        assert run("--url", args[1], "init", cwd=tmp_path).returncode == 0
    done = run(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("agent-ledger: malformed URL 'postgresql://[::1")
    assert "Invalid IPv6 URL" in done.stderr


@pytest.mark.postgres
def test_a_store_error_with_the_drivers_caret_is_one_line(tmp_path: Path) -> None:
    """psycopg's text under a failed statement has ``LINE 1: ...`` and a caret;
    the CLI prints only its first line (a hand-damaged table here)."""
    import psycopg
    from psycopg import sql

    from tests.cli.conftest import Cli
    from tests.harness import DSN, require_postgres

    require_postgres()
    schema = f"agent_ledger_cli_{uuid.uuid4().hex[:12]}"
    cli = Cli(f"{DSN}?schema={schema}", tmp_path)
    try:
        assert cli("init").returncode == 0
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER TABLE {} DROP COLUMN tool CASCADE").format(
                    sql.Identifier(schema, "agent_ledger_effects")
                )
            )
        for command in ("stats", "list"):
            done = cli(command)
            assert done.returncode == 1, done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
            assert done.stderr.startswith("agent-ledger: store ")
            assert 'column "tool" does not exist' in done.stderr
            assert "LINE 1" not in done.stderr and "^" not in done.stderr
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
