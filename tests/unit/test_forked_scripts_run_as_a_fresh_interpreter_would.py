"""tests/forkserver.py runs a script as ``python SCRIPT ARGS`` would: the docs'
snippets and the 0.2.1 worker rely on it (same output, exit code, folder,
environment, stdin, ``__main__``, ``sys.path[0]``, exit handlers and errors)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forkserver

PROBE = """\
import atexit, json, os, sys, threading
import agent_ledger

atexit.register(lambda: print("atexit ran", flush=True))
# Not a daemon: the interpreter waits for it on the way out, before atexit.
printed = threading.Event()
threading.Thread(target=lambda: (printed.wait(), print("thread ran", flush=True))).start()
print(json.dumps({
    "name": __name__,
    "file": __file__,
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "env": os.environ.get("PROBE_ENV"),
    "stdin": sys.stdin.read(),
    "main": sys.modules["__main__"].__dict__ is globals(),
}), flush=True)
printed.set()
if sys.argv[1:] == ["raise"]:
    raise ValueError("boom")
if sys.argv[1:] == ["exit"]:
    sys.exit(3)
"""


def _fresh(script: Path, *args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env,
        input="from stdin",
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def _forked(script: Path, *args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    done = forkserver.run(
        [script, *args], cwd=cwd, env=env, input="from stdin", preload=["agent_ledger"]
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("args", [(), ("raise",), ("exit",)], ids=["ok", "raise", "exit"])
def test_a_forked_script_behaves_as_a_fresh_one(args: tuple[str, ...], tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    folder = tmp_path / "cwd"
    folder.mkdir()
    env = {**os.environ, "PROBE_ENV": "set"}
    fresh = _fresh(script, *args, cwd=folder, env=env)
    forked = _forked(script, *args, cwd=folder, env=env)
    assert forked[:2] == fresh[:2]
    assert fresh[0] == {(): 0, ("raise",): 1, ("exit",): 3}[args]
    assert "thread ran" in fresh[1] and "atexit ran" in fresh[1]
    # The traceback differs only in the frames above the script's own.
    assert forked[2].splitlines()[-3:] == fresh[2].splitlines()[-3:]


def test_a_script_that_outlives_its_timeout_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([script], cwd=tmp_path, timeout=0.5)
    # The server is still there for the next script.
    ok = tmp_path / "ok.py"
    ok.write_text("print('next')\n")
    assert forkserver.run([ok], cwd=tmp_path).stdout == "next\n"
