"""A failover under load: the primary is SIGKILLed, its synchronous standby promoted.

Two clusters of their own (Debian's PostgreSQL 15 binaries, run as the
``postgres`` OS user, in a temporary folder, on free ports): a primary with
``synchronous_standby_names`` naming a standby made by ``pg_basebackup``.
Workers reach them through one multi-host DSN
(``host=a,b ... target_session_attrs=read-write``), as production does.
Mid-load the primary's postmaster and its backends are SIGKILLed and the
standby is promoted. Then, on the new primary:

* every effect whose ``run()`` returned to its caller is there, succeeded;
* no handler ran twice for one key except after a takeover (a new attempt),
  and never twice for one attempt;
* the workers are back within a bound after the promotion;
* a worker that was inside its handler during the switch is fenced: its
  effect was taken over on the new primary, and its late commit changes
  nothing.

The main server on 5432 is not touched. Both clusters are stopped and
removed at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_ledger import EffectLedgerError, RunOptions, ToolCall
from agent_ledger.effects import Effect
from agent_ledger.options import StaleOptions
from agent_ledger.status import EffectStatus
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger
from tests.reliability.conftest import report

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

BIN = Path("/usr/lib/postgresql/15/bin")
SCHEMA = "agent_ledger_failover"
#: A holder silent this long is taken over (short, so the test is quick).
LEASE_MS = 3000
#: The longest the workers may take to get a step through after the promotion.
RECONNECT_BOUND_S = 15.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(*command: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


def _pg(tool: str, *args: str, timeout: float = 120) -> None:
    done = subprocess.run(
        _as_postgres(str(BIN / tool), *args), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{tool} {args}: {done.stdout}{done.stderr}"


class Clusters:
    """A primary and its synchronous standby in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.primary = root / "primary"
        self.standby = root / "standby"
        self.primary_port = _free_port()
        self.standby_port = _free_port()

    def dsn(self, port: int) -> str:
        return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    @property
    def multi_host_dsn(self) -> str:
        return (
            "host=127.0.0.1,127.0.0.1"
            f" port={self.primary_port},{self.standby_port}"
            " user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2"
        )

    def start(self) -> None:
        _pg("initdb", "-D", str(self.primary), "-U", "postgres", "--auth=trust", "-N")
        with (self.primary / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.primary_port}\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "wal_level = replica\n"
                "max_wal_senders = 4\n"
                "shared_buffers = 32MB\n"
                "synchronous_commit = on\n"
                "synchronous_standby_names = 'standby'\n"
            )
        _pg("pg_ctl", "-D", str(self.primary), "-l", str(self.root / "primary.log"), "-w", "start")
        _pg(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
            "-D", str(self.standby), "-R", "-X", "stream",
        )  # fmt: skip
        with (self.standby / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"port = {self.standby_port}\n"
                f"primary_conninfo = 'host=127.0.0.1 port={self.primary_port} user=postgres"
                " application_name=standby'\n"
            )
        _pg("pg_ctl", "-D", str(self.standby), "-l", str(self.root / "standby.log"), "-w", "start")
        deadline = time.monotonic() + 30
        with psycopg.connect(self.dsn(self.primary_port), autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
                ).fetchone()
                if row == ("sync",):
                    return
                assert time.monotonic() < deadline, f"the standby never became sync: {row}"
                time.sleep(0.2)

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every process it started."""
        pid = int((self.primary / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True
        ).stdout.split()
        for one in [pid, *map(int, children)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(one, signal.SIGKILL)

    def promote(self) -> None:
        """Promote the standby, then stop waiting for a synchronous standby it no longer has.

        The standby copied ``synchronous_standby_names`` from its primary: left
        as it is, every commit on the new primary would wait for ever for a
        standby named ``standby``. A failover manager does the same (Patroni
        rewrites it, for one); until a new standby is attached, commits are
        acknowledged by this server alone.
        """
        _pg("pg_ctl", "-D", str(self.standby), "-w", "promote")
        with psycopg.connect(self.dsn(self.standby_port), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")

    def stop(self) -> None:
        for data in (self.primary, self.standby):
            if (data / "postmaster.pid").exists():
                subprocess.run(
                    _as_postgres(str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"),
                    capture_output=True,
                    timeout=60,
                )


@contextlib.contextmanager
def clusters() -> Iterator[Clusters]:
    if not (BIN / "initdb").exists() or not (BIN / "pg_basebackup").exists():
        pytest.skip(f"PostgreSQL 15 server binaries not found in {BIN}")
    root = Path(tempfile.mkdtemp(prefix="agent-ledger-failover-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    pair = Clusters(root)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)


class Load:
    """Workers running fresh keys in a loop, retrying a key until it is acknowledged."""

    def __init__(self) -> None:
        #: (key, attempt) of every handler run.
        self.runs: list[tuple[str, int]] = []
        self.acknowledged: set[str] = set()
        self.errors = 0
        self.last_ack = 0.0
        self.stop = asyncio.Event()

    async def worker(self, store: PostgresStore, name: str) -> None:
        ledger = build_ledger(store)
        options = RunOptions(stale=StaleOptions(after_ms=LEASE_MS))
        n = 0
        while not self.stop.is_set():
            call = ToolCall(workflow_id="failover", tool="pay", args={"worker": name, "n": n})

            try:
                result = await ledger.run(call, self.handler, options)
            except EffectLedgerError:
                # The caller's retry: the same call, so the same key.
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            self.acknowledged.add(result["key"])
            self.last_ack = time.monotonic()
            n += 1

    def handler(self, effect: Effect) -> dict[str, str]:
        self.runs.append((effect.idem_key, effect.attempt))
        return {"key": effect.idem_key}


async def _store(dsn: str, max_size: int = 4) -> PostgresStore:
    return await PostgresStore.connect(dsn, schema=SCHEMA, max_size=max_size, connect_timeout=20)


async def _until(predicate: Any, bound_s: float, what: str) -> float:
    """Seconds until ``predicate()`` held; fails past ``bound_s``."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < bound_s, f"{what} not within {bound_s} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_acknowledged_effects_survive_a_failover_to_a_synchronous_standby() -> None:
    with clusters() as pair:
        setup = await _store(pair.dsn(pair.primary_port))
        await setup.create_schema()
        await setup.close()
        options = RunOptions(stale=StaleOptions(after_ms=LEASE_MS))

        # A worker inside its handler when the primary dies, whose link to the
        # database does not come back (its heartbeats fail from the kill on).
        caught_store = await _store(pair.multi_host_dsn)
        inside, release = asyncio.Event(), asyncio.Event()

        async def slow(effect: Effect) -> dict[str, str]:
            inside.set()
            await release.wait()
            return {"by": "late"}

        caught_call = ToolCall(workflow_id="failover", tool="slow", args={})
        caught = asyncio.create_task(build_ledger(caught_store).run(caught_call, slow, options))
        await inside.wait()

        load = Load()
        stores = [await _store(pair.multi_host_dsn) for _ in range(3)]
        workers = [asyncio.create_task(load.worker(s, f"w{i}")) for i, s in enumerate(stores)]
        taker_store: PostgresStore | None = None
        try:
            await _until(lambda: len(load.acknowledged) >= 30, 30, "30 effects before the kill")
            acknowledged_before = len(load.acknowledged)

            async def deaf(*args: object, **kwargs: object) -> Any:
                raise OSError("this worker's link did not come back")

            caught_store.heartbeat = deaf  # type: ignore[method-assign]
            killed = time.monotonic()
            pair.kill_primary()
            await asyncio.sleep(0.5)  # a moment with no primary at all
            await asyncio.to_thread(pair.promote)
            promoted = time.monotonic()
            back_s = await _until(
                lambda: load.last_ack > promoted, RECONNECT_BOUND_S, "a step after the promotion"
            )
            await asyncio.sleep(2.0)  # more load on the new primary

            # Another caller takes the caught effect over once its lease ran out.
            taker_store = await _store(pair.multi_host_dsn)
            taken = await build_ledger(taker_store).run(
                caught_call, lambda effect: {"by": "taker"}, options
            )
            assert taken == {"by": "taker"}
        finally:
            load.stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
            release.set()
            late = await asyncio.gather(caught, return_exceptions=True)
            for store in [*stores, caught_store, *([taker_store] if taker_store else [])]:
                await store.close()

        # What the new primary holds.
        with psycopg.connect(pair.dsn(pair.standby_port), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT idem_key, status, attempt, result::text, tool, id::text"
                f" FROM {SCHEMA}.agent_ledger_effects"
            ).fetchall()
        stored = {key: (status, attempt, result) for key, status, attempt, result, *_ in rows}
        (caught_row,) = [row for row in rows if row[4] == "slow"]
        missing = [key for key in load.acknowledged if key not in stored]
        assert not missing, f"{len(missing)} acknowledged effects lost in the failover"
        assert all(stored[key][0] == EffectStatus.SUCCEEDED.value for key in load.acknowledged)
        # Handlers: never twice for one attempt; more than once only after a takeover.
        per_attempt = Counter(load.runs)
        assert max(per_attempt.values()) == 1, "a handler ran twice for one attempt"
        per_key = Counter(key for key, _ in load.runs)
        twice = {key: n for key, n in per_key.items() if n > 1}
        for key, n in twice.items():
            assert stored[key][1] >= n, f"{key}: {n} runs with attempt {stored[key][1]}"
        # Fencing: the caught worker's late outcome never landed.
        assert caught_row[1:4] == (EffectStatus.SUCCEEDED.value, 2, '{"by":"taker"}'), caught_row
        # Its commit, sent now to the new primary as attempt 1, is refused by the fence.
        late_store = await _store(pair.multi_host_dsn)
        try:
            landed = await late_store.commit(
                caught_row[5],
                attempt=1,
                status=EffectStatus.SUCCEEDED,
                result_json='{"by": "late"}',
                error=None,
            )
            effect = await late_store.get(caught_row[5])
        finally:
            await late_store.close()
        assert not landed
        assert effect is not None and effect.attempt == 2 and effect.result == {"by": "taker"}
        report(
            "failover to a synchronous standby",
            acknowledged_before_kill=acknowledged_before,
            acknowledged=len(load.acknowledged),
            lost=len(missing),
            errors_seen_by_callers=load.errors,
            takeovers=len(twice),
            kill_to_promoted_s=round(promoted - killed, 2),
            promoted_to_first_ack_s=round(back_s, 2),
            late_commit=f"{type(late[0]).__name__}: {late[0]}"[:160],
        )
