"""Short scripts in fresh processes, without each paying for its imports again.

``run([script, *args], python=..., preload=[...])`` does what
``subprocess.run([python, script, *args], capture_output=True, text=True)``
does, but the process is forked from a server (tests/forkserver_main.py) that
started ``python`` once and imported the ``preload`` modules once. A docs
snippet or a 0.2.1 worker spends most of its CPU on importing agent_ledger
(0.2-0.4 CPU-s an interpreter), and the suite starts about a hundred of them.

Each forked process is still a process of its own: its own folder,
environment, files, ``__main__`` and interpreter shutdown. What it shares
with the server is only what importing the preloaded modules did, so use
``preload`` only with modules the script imports itself, first thing (then a
fresh interpreter would have done the same imports before anything else).

One server per (interpreter, modules) per test process, started when first
needed; it ends when this process closes its pipe (at exit, or when it dies).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MAIN = Path(__file__).with_name("forkserver_main.py")


class ForkServer:
    """A started tests/forkserver_main.py and the pipes to it."""

    def __init__(self, python: str, preload: Sequence[str]) -> None:
        to_server_r, self._to_server = os.pipe()
        self._from_server, from_server_w = os.pipe()
        self.process = subprocess.Popen(
            # -c, not the file: the file's folder (tests/, with its typing/)
            # would come first on sys.path.
            [python, "-c", MAIN.read_text(), str(to_server_r), str(from_server_w), *preload],
            pass_fds=(to_server_r, from_server_w),
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
        os.close(to_server_r)
        os.close(from_server_w)
        self._pending = b""
        self._lock = threading.Lock()
        ready = self._read(timeout=120)
        if ready != {"ready": True}:
            raise RuntimeError(f"the fork server for {python} {list(preload)} did not start")

    def _read(self, timeout: float) -> Any:
        """The server's next JSON line, waiting at most ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_server], [], [], max(left, 0))
            if not ready:
                raise subprocess.TimeoutExpired("forkserver", timeout)
            chunk = os.read(self._from_server, 4096)
            if not chunk:
                raise RuntimeError("the fork server ended")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str],
        env: Mapping[str, str],
        input: str | None,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        with self._lock, tempfile.TemporaryDirectory(prefix="forkserver-") as folder:
            files = {name: Path(folder, name) for name in ("stdin", "stdout", "stderr")}
            files["stdin"].write_text(input or "")
            files["stdout"].touch()
            files["stderr"].touch()
            request = {
                "argv": [str(arg) for arg in argv],
                "cwd": os.fspath(cwd),
                "env": dict(env),
                **{name: str(path) for name, path in files.items()},
            }
            os.write(self._to_server, (json.dumps(request) + "\n").encode())
            pid = self._read(timeout=30)["pid"]
            try:
                status = self._read(timeout=timeout)["status"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._read(timeout=30)
                raise subprocess.TimeoutExpired(list(argv), timeout) from None
            return subprocess.CompletedProcess(
                list(argv),
                os.waitstatus_to_exitcode(status),
                files["stdout"].read_text(),
                files["stderr"].read_text(),
            )

    def close(self) -> None:
        os.close(self._to_server)
        os.close(self._from_server)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_servers: dict[tuple[str, tuple[str, ...]], ForkServer] = {}


def close_all() -> None:
    """Stop every server this process started (and wait for it: its CPU time counts)."""
    while _servers:
        _servers.popitem()[1].close()


atexit.register(close_all)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 60,
    python: str = sys.executable,
    preload: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, *argv], ...)`` with output captured as text, forked
    from a server that has imported ``preload`` (see the module's docstring)."""
    key = (python, tuple(preload))
    server = _servers.get(key)
    if server is None or server.process.poll() is not None:
        server = _servers[key] = ForkServer(python, preload)
    return server.run(
        [os.fspath(arg) for arg in argv],
        cwd=cwd,
        env=os.environ if env is None else env,
        input=input,
        timeout=timeout,
    )
