"""`agent-ledger console` served by uvicorn, as a process, over real TCP.

Behind a proxy, the principal comes from the proxy's header only when the
connection's real peer is a trusted proxy. uvicorn's default would take the
client address from X-Forwarded-For whenever the peer is 127.0.0.1, so any
local process could pose as the proxy; the CLI turns that off. A proxy on the
same host passes the public origin with ``--allowed-origin``, and its requests
(with X-Forwarded-For naming the browser) decide.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.cli import CONSOLE_SECRET_ENV

PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 12_500}, workflow_id="wf-proxy")
BOSS = {"X-Forwarded-Email": "boss@corp.example"}
PUBLIC = "https://approvals.corp.example"
#: ``--allowed-origin`` as a person might type it: case, the default port, a slash.
TYPED = "https://Approvals.Corp.Example:443/"
CLI = (sys.executable, "-m", "agent_ledger", "--url")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _parked(db: Path) -> str:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(db)))
    try:
        with pytest.raises(ApprovalPendingError):
            await ledger.run(
                PAY, lambda e: "paid", RunOptions(requires_approval=True, wait_for_approval=False)
            )
        return ledger.idem_key(PAY)
    finally:
        await ledger.store.close()


async def _status(db: Path, key: str) -> tuple[EffectStatus, str | None]:
    store = SqliteStore(db)
    try:
        effect = await store.find(key)
        assert effect is not None
        return effect.status, effect.decided_by
    finally:
        await store.close()


class _Console:
    def __init__(self, base: str, process: subprocess.Popen[str]) -> None:
        self.base = base
        self.process = process


@contextmanager
def _serve(db: Path, *options: str) -> Iterator[_Console]:
    port = _free_port()
    env = {**os.environ, CONSOLE_SECRET_ENV: "s" * 40}
    process = subprocess.Popen(
        [
            *CLI,
            f"sqlite:///{db}",
            "console",
            *("--proxy-header", "X-Forwarded-Email", "--allow", "boss@corp.example:pay*"),
            *("--host", "127.0.0.1", "--port", str(port), *options),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    _, err = process.communicate()
                    raise AssertionError(f"the console did not start: {err}") from None
                time.sleep(0.1)
        yield _Console(base, process)
    finally:
        process.terminate()
        process.communicate(timeout=30)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


def test_a_local_process_cannot_pose_as_the_proxy_with_x_forwarded_for(db: Path) -> None:
    key = asyncio.run(_parked(db))
    with _serve(db, "--trusted-proxy", "10.0.0.5") as console:
        spoof = {**BOSS, "X-Forwarded-For": "10.0.0.5"}
        assert httpx.get(console.base + "/", headers=BOSS).status_code == 401
        assert httpx.get(console.base + "/", headers=spoof).status_code == 401
        page = httpx.get(f"{console.base}/effects/{key}", headers=spoof)
        assert page.status_code == 401
    assert asyncio.run(_status(db, key)) == (EffectStatus.REQUIRES_APPROVAL, None)


def test_a_proxy_on_the_same_host_decides_with_its_public_origin(db: Path) -> None:
    key = asyncio.run(_parked(db))
    proxied = {**BOSS, "X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}
    with _serve(db, "--trusted-proxy", "127.0.0.1", "--allowed-origin", TYPED) as console:
        page = httpx.get(f"{console.base}/effects/{key}", headers=proxied)
        assert page.status_code == 200, page.text
        fields = dict(re.findall(r'name="(csrf|intent)" value="([0-9a-f]+)"', page.text))
        other_site = httpx.post(
            f"{console.base}/effects/{key}/decide",
            headers={**proxied, "Origin": "https://evil.example"},
            data={**fields, "action": "approve"},
        )
        assert other_site.status_code == 403
        decided = httpx.post(
            f"{console.base}/effects/{key}/decide",
            headers={**proxied, "Origin": PUBLIC, "Sec-Fetch-Site": "same-origin"},
            data={**fields, "action": "approve"},
        )
        assert decided.status_code == 303, decided.text
    assert asyncio.run(_status(db, key)) == (EffectStatus.READY, "boss@corp.example")


@pytest.mark.parametrize(
    "origin", ["approvals.corp.example", "https://approvals.corp.example/path", "ftp://x"]
)
def test_an_allowed_origin_that_is_not_an_origin_is_a_usage_error(db: Path, origin: str) -> None:
    asyncio.run(_parked(db))
    done = subprocess.run(
        [
            *CLI,
            f"sqlite:///{db}",
            "console",
            *("--proxy-header", "X-Forwarded-Email", "--trusted-proxy", "127.0.0.1"),
            *("--allow", "boss@corp.example:pay*", "--allowed-origin", origin),
        ],
        env={**os.environ, CONSOLE_SECRET_ENV: "s" * 40},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--allowed-origin takes" in done.stderr and origin in done.stderr
