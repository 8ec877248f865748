"""The fork server's own process (tests/forkserver.py starts it; stdlib only).

``python -c "$(cat forkserver_main.py)" CONTROL_IN CONTROL_OUT MODULE...`` imports each
MODULE once, then serves requests read as JSON lines from file descriptor
CONTROL_IN: for each one it forks a child, writes ``{"pid": ...}`` and then,
once the child has ended, ``{"status": ...}`` (its wait status) to
CONTROL_OUT. The child runs the requested script as ``__main__`` the way
``python SCRIPT ARGS...`` would, in the requested folder and environment,
with the requested files as its stdin, stdout and stderr, and ends as such
an interpreter ends (uncaught exceptions printed, ``atexit`` handlers run).
The server ends when CONTROL_IN is closed.

It runs under any interpreter (the 0.2.1 virtualenv's too), so it imports
nothing but the standard library before the requested modules.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import sys
import threading
import types
from typing import Any


def _serve(control_in: int, control_out: int) -> dict[str, Any]:
    """Answer requests until the client goes; return (in a child only) its request."""
    reader = os.fdopen(control_in, "r", encoding="utf-8", closefd=False)
    while True:
        line = reader.readline()
        if not line:
            os._exit(0)
        request: dict[str, Any] = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.close(control_in)
            os.close(control_out)
            return request
        os.write(control_out, (json.dumps({"pid": pid}) + "\n").encode())
        _, status = os.waitpid(pid, 0)
        os.write(control_out, (json.dumps({"status": status}) + "\n").encode())


def _become(request: dict[str, Any]) -> types.CodeType:
    """In the child: take on the request's folder, environment, files and argv."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, (path, flags) in enumerate(
        [
            (request["stdin"], os.O_RDONLY),
            (request["stdout"], os.O_WRONLY | os.O_TRUNC),
            (request["stderr"], os.O_WRONLY | os.O_TRUNC),
        ]
    ):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    with open(script, "rb") as source:
        return compile(source.read(), script, "exec")


def main() -> None:
    control_in, control_out = int(sys.argv[1]), int(sys.argv[2])
    # The client starts this with -c in /, so sys.path[0] is "" (the folder /):
    # nothing in tests/ shadows the standard library.
    for module in sys.argv[3:]:
        importlib.import_module(module)
    # fork() copies one thread: an imported module that started another would
    # leave it missing (and its locks maybe held) in every child.
    if threading.active_count() != 1:
        raise SystemExit(f"forkserver: importing {sys.argv[3:]} started a thread")
    os.write(control_out, b'{"ready": true}\n')
    request = _serve(control_in, control_out)
    code = _become(request)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(
        __file__=request["argv"][0], __builtins__=builtins, __cached__=None, __loader__=None
    )
    sys.modules["__main__"] = main_module
    exec(code, main_module.__dict__)


if __name__ == "__main__":
    main()
