"""A PgBouncer in transaction mode in front of the test server, for the pooler tests.

Debian's ``pgbouncer`` binary, started on a free port on 127.0.0.1 with its
own ini and userlist in a temporary folder: ``pool_mode = transaction`` (each
client transaction gets whichever server connection is free, as in
production), ``auth_type = trust``, one database entry that forwards to the
test DSN's server and database. Nothing of the machine's own PgBouncer (its
service, ``/etc/pgbouncer``) is used or touched.

PgBouncer refuses to run as root; as root it is started with ``-u postgres``
and the folder is handed to that user. It runs until :meth:`stop`
(``started_pgbouncer`` stops it at the end of the test session).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PGBOUNCER",
    "PgBouncer",
    "pgbouncer_for",
    "pgbouncer_missing",
    "start_pgbouncer",
    "started_pgbouncer",
    "stop_pgbouncer",
]

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
#: .ci/run installs the package when the binary is missing.
PGBOUNCER_MISSING = "pgbouncer is not installed (apt-get install -y pgbouncer)"


def pgbouncer_missing() -> str | None:
    """Why PgBouncer cannot be started here, or None if it can."""
    return None if Path(PGBOUNCER).exists() else PGBOUNCER_MISSING


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgBouncer:
    """A running PgBouncer; ``dsn`` reaches the test database through it."""

    process: subprocess.Popen[bytes]
    folder: Path
    port: int
    dsn: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def start_pgbouncer(upstream_dsn: str, *, pool_size: int = 20) -> PgBouncer:
    """Start PgBouncer in transaction mode in front of ``upstream_dsn``'s server."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    upstream = conninfo_to_dict(upstream_dsn)
    host = str(upstream.get("host") or "127.0.0.1")
    server_port = str(upstream.get("port") or 5432)
    dbname = str(upstream.get("dbname") or "postgres")
    user = str(upstream.get("user") or "postgres")
    port = _free_port()
    folder = Path(tempfile.mkdtemp(prefix="agent-ledger-pgbouncer-"))
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{dbname} = host={host} port={server_port} dbname={dbname} user={user}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
        "server_reset_query =\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        "log_connections = 0\n"
        "log_disconnections = 0\n"
    )
    (folder / "userlist.txt").write_text(f'"{user}" ""\n')
    command = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:
        # PgBouncer will not run as root: hand it the folder and drop to postgres.
        owner = pwd.getpwnam("postgres")
        for path in (folder, ini, folder / "userlist.txt"):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        command = [PGBOUNCER, "-u", "postgres", str(ini)]
    # Its own messages go to its logfile; what it says before opening it, to stderr.
    with open(folder / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
        )
    dsn = make_conninfo(upstream_dsn, host="127.0.0.1", port=str(port))
    bouncer = PgBouncer(process, folder, port, dsn)
    deadline = time.monotonic() + 15
    while True:
        if process.poll() is not None:
            err = (folder / "stderr.txt").read_text(errors="replace")
            log = bouncer.log()
            bouncer.stop()
            raise RuntimeError(f"pgbouncer exited at start: {err}{log}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return bouncer
        if time.monotonic() > deadline:
            bouncer.stop()
            raise RuntimeError("pgbouncer did not listen within 15 s")
        time.sleep(0.05)


_running: PgBouncer | None = None


def started_pgbouncer(upstream_dsn: str) -> PgBouncer:
    """The session's PgBouncer, started at the first call (stopped by ``stop_pgbouncer``)."""
    global _running
    if _running is None or _running.process.poll() is not None:
        _running = start_pgbouncer(upstream_dsn)
    return _running


def stop_pgbouncer() -> None:
    global _running
    running, _running = _running, None
    if running is not None:
        running.stop()


@contextlib.contextmanager
def pgbouncer_for(upstream_dsn: str, *, pool_size: int = 20) -> Iterator[PgBouncer]:
    """A PgBouncer of its own for one test, stopped at the end."""
    bouncer = start_pgbouncer(upstream_dsn, pool_size=pool_size)
    try:
        yield bouncer
    finally:
        bouncer.stop()
