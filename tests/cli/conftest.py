"""Run the `agent-ledger` command against real stores.

``Cli`` calls the command's ``main()`` in this process (on a thread of its
own, with its own stdin, stdout, stderr, working folder and environment),
which is what nearly every test is about: what the command does and says.
That saves starting an interpreter per command (about half a CPU-second
each). ``Cli(..., own_process=True)``, ``run_cli`` and ``SCRIPT`` run the real
console script in a child process, for the tests about the process itself:
the installed entry point, exit codes seen by a shell, terminals, signals,
another process holding an effect.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import shutil
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import DSN, require_postgres

SCRIPT = shutil.which("agent-ledger", path=str(Path(sys.executable).parent)) or "agent-ledger"
#: Variables a test's command must not inherit from the shell that runs pytest.
_UNSET = ("AGENT_LEDGER_URL", "NO_COLOR")
#: One in-process command at a time: they share the process's cwd, environment and streams.
_IN_PROCESS = threading.Lock()


@contextlib.contextmanager
def _as_a_fresh_process(
    cwd: Path, stdin: str, env: dict[str, str]
) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """cwd, environment, streams and warning filters as a new `agent-ledger` process has them."""
    out, err = io.StringIO(), io.StringIO()
    changed = {*_UNSET, *env}
    saved_env = {name: os.environ.pop(name) for name in changed if name in os.environ}
    os.environ.update(env)
    saved_cwd = os.getcwd()
    saved_stdin = sys.stdin
    # What `--app` imports stays in this command, as it would in its own process.
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    saved_finders = set(sys.path_importer_cache)
    os.chdir(cwd)
    sys.stdin = io.StringIO(stdin)
    try:
        # A fresh interpreter's warning filters, not pytest's "error".
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.simplefilter("default")
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield out, err
    finally:
        sys.stdin = saved_stdin
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            del sys.modules[name]
        for entry in set(sys.path_importer_cache) - saved_finders:
            del sys.path_importer_cache[entry]
        importlib.invalidate_caches()
        os.chdir(saved_cwd)
        for name in changed:
            os.environ.pop(name, None)
        os.environ.update(saved_env)


def run_in_process(
    args: list[str], cwd: Path, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``agent-ledger *args`` by calling ``cli.main``; the result a child process would give.

    ``env``: variables set for the command (beside the shell's, less ``_UNSET``)."""
    from agent_ledger import cli

    def call() -> subprocess.CompletedProcess[str]:
        with _IN_PROCESS, _as_a_fresh_process(cwd, stdin, env or {}) as (out, err):
            try:
                code: object = cli.main(args, stdout=out)
            except SystemExit as exc:  # argparse: --help, usage errors
                code = exc.code
            if isinstance(code, str):
                print(code, file=err)
                code = 1
        returncode = code if isinstance(code, int) else 0
        return subprocess.CompletedProcess(
            [SCRIPT, *args], returncode, out.getvalue(), err.getvalue()
        )

    # A thread of its own: the command runs its own event loop (asyncio.run),
    # which it could not inside an async test's running loop.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(call).result(timeout=60)


@dataclass
class Cli:
    url: str
    cwd: Path
    #: Run the real console script in a child process instead (see the module).
    own_process: bool = False

    def __call__(
        self, *args: str, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = ["--url", self.url, *args]
        if not self.own_process:
            return run_in_process(argv, self.cwd, input_text or "")
        env = {k: v for k, v in os.environ.items() if k not in _UNSET}
        return subprocess.run(
            [SCRIPT, *argv],
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
