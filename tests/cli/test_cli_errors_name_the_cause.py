"""A newcomer's first hour with the CLI (issue 30): every error on stderr with the
`agent-ledger:` prefix, saying what was wrong in the CLI's own words."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.conftest import SCRIPT, Cli, run_in_process

DEMO_REFUND = "298608e47a56"  # the refund the demo leaves waiting for a person


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """The command's wording, from ``cli.main`` in this process; with a ``prefix``
    (another user's powers) the real console script under it."""
    if not prefix:
        return run_in_process(list(args), cwd, env=env)
    clean = {k: v for k, v in os.environ.items() if k not in ("AGENT_LEDGER_URL", "NO_COLOR")}
    return subprocess.run(
        [*prefix, SCRIPT, *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The one stderr line of a failed command, checked for the CLI's form."""
    assert done.returncode == code, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("agent-ledger: "), lines[0]
    return lines[0]


def test_sagas_show_of_an_unknown_saga_is_an_error_on_stderr(cli: Cli) -> None:
    assert cli("init").returncode == 0
    line = one_error(cli("sagas", "show", "nosuch"), 1)
    assert line == "agent-ledger: no saga 'nosuch'"


def test_init_does_not_create_a_missing_folder_unless_told(tmp_path: Path) -> None:
    """A typo in a path is an error naming the folder, not a quiet new folder."""
    url = "sqlite:///nodir/x.db"
    line = one_error(run("init", "--url", url, cwd=tmp_path), 2)
    assert "the folder nodir does not exist" in line and "--create-dirs" in line
    assert not (tmp_path / "nodir").exists()
    done = run("init", "--url", url, "--create-dirs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "agent-ledger: created the folder nodir\n"
    assert (tmp_path / "nodir" / "x.db").exists()
    again = run("init", "--url", url, cwd=tmp_path)  # the folder is there now
    assert again.returncode == 0 and again.stderr == ""


def test_demo_does_not_create_a_missing_folder_unless_told(tmp_path: Path) -> None:
    line = one_error(run("demo", "--url", "sqlite:///nodir/x.db", cwd=tmp_path), 2)
    assert "--create-dirs" in line and not (tmp_path / "nodir").exists()


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("port=notaport", "port must be a number, got 'notaport'"),
        ("connect_timeout=soon", "connect_timeout must be a number, got 'soon'"),
        ("nosuchparameter=1", 'invalid URI query parameter: "nosuchparameter"'),
    ],
)
def test_a_malformed_postgres_url_is_a_usage_error_at_once(
    tmp_path: Path, query: str, says: str
) -> None:
    """Exit 2 like every bad URL, before any connection (no pool retrying for seconds)."""
    url = f"postgresql://postgres@127.0.0.1:5432/test?{query}"
    started = time.monotonic()
    line = one_error(run("list", "--url", url, cwd=tmp_path), 2)
    assert time.monotonic() - started < 5
    assert "malformed PostgreSQL connection string" in line and says in line


def test_a_port_that_is_not_a_number_in_the_host_part_is_a_usage_error(tmp_path: Path) -> None:
    line = one_error(run("list", "--url", "postgresql://postgres@127.0.0.1:abc/x", cwd=tmp_path), 2)
    assert "port must be a number" in line


@pytest.mark.parametrize(
    ("value", "code", "says"),
    [
        ("bogus", 2, "not a store URL: 'bogus'"),
        ("postgresql://postgres@127.0.0.1/test?port=x", 2, "port must be a number"),
        ("sqlite:///./missing.db", 1, "agent-ledger init"),
    ],
)
def test_an_error_from_the_environment_url_says_where_it_came_from(
    tmp_path: Path, value: str, code: int, says: str
) -> None:
    line = one_error(run("list", cwd=tmp_path, env={"AGENT_LEDGER_URL": value}), code)
    assert says in line
    assert line.endswith("(the URL came from $AGENT_LEDGER_URL; --url overrides it)")
    # The same URL given with --url is not blamed on the environment.
    typed = one_error(run("list", "--url", value, cwd=tmp_path), code)
    assert "AGENT_LEDGER_URL" not in typed


def _without_root_powers() -> tuple[str, ...]:
    """A command prefix under which file permissions apply (root ignores them)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be made")
    # Root with an empty capability bounding set has no CAP_DAC_OVERRIDE.
    return (setpriv, "--bounding-set=-all")


@pytest.mark.parametrize("command", [("init",), ("list",), ("approve", DEMO_REFUND)])
def test_a_read_only_folder_says_why_the_database_cannot_be_opened(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    assert run("demo", "--url", "sqlite:///ro/ledger.db", cwd=tmp_path).returncode == 0
    for leftover in folder.glob("ledger.db-*"):  # the WAL files and holders folder it left
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    prefix = _without_root_powers()
    folder.chmod(0o555)
    try:
        done = run(*command, "--url", "sqlite:///ro/ledger.db", cwd=tmp_path, prefix=prefix)
    finally:
        folder.chmod(0o755)
    line = one_error(done, 1)
    assert "the folder ro is read-only for you, and SQLite writes there" in line


@pytest.mark.parametrize("form", [["--since", "-2h"], ["--since=-2h"], ["--until", "-30m"]])
def test_a_signed_duration_gets_a_clear_message(tmp_path: Path, form: list[str]) -> None:
    """Not argparse's "expected one argument": what to write instead."""
    line = one_error(run("list", "--url", "memory://", *form, cwd=tmp_path), 2)
    assert "a duration is always ago and takes no sign" in line
    assert "2h means 2h ago" in line or "30m means 30m ago" in line


def test_show_keeps_the_wait_for_a_person_out_of_the_handler_time(tmp_path: Path) -> None:
    """The demo's refund waits 1 s for its approval; its handler takes milliseconds."""
    assert run("demo", "payment", cwd=tmp_path).returncode == 0
    time.sleep(1.0)
    assert run("approve", DEMO_REFUND, "--by", "ada", cwd=tmp_path).returncode == 0
    assert run("demo", "payment", cwd=tmp_path).returncode == 0  # runs the refund
    shown = run("show", DEMO_REFUND, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = {line[:13].strip(): line[13:].strip() for line in shown.stdout.splitlines() if line}
    assert "run time" not in rows
    wait, took = rows["approval wait"], rows["handler time"]
    assert wait.endswith(" s") and float(wait.split()[0]) >= 1.0, wait
    assert took.endswith(" ms"), took
