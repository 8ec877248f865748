"""The approval console in a real browser (issue 28): headless Chromium from Debian's
`chromium` package, driven by Playwright with ``executable_path`` (no browser is
ever downloaded), against `agent-ledger console` serving a SQLite file.

A person logs in, sees the pending payment with its exact arguments, approves
it, and the `run()` waiting in another thread returns; a second session's stale
page is told "already decided by alice"; a self-submitting form on another
origin is refused; a link's GET changes nothing until its confirmation POST.
Screenshots of the pending list and the receipt (desktop and phone width) land
in screenshots/ (git-ignored); docs/images holds one of each.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

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
from agent_ledger.approvals import DecisionAction
from agent_ledger.console import hash_password, sign_link
from agent_ledger.deciding import effect_intent
from tests.cli.conftest import SCRIPT
from tests.test_home_page_fits_the_screen import CHROMIUM, CHROMIUM_ARGS, SHOTS, WIDTHS

pytestmark = pytest.mark.slow

SECRET = "b" * 32
PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 12_500}, workflow_id="wf-browser")
REFUND = ToolCall(tool="pay", args={"to": "acme", "cents": -300}, workflow_id="wf-browser")
PARK = RunOptions(requires_approval=True, wait_for_approval=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _status(db: Path, call: ToolCall) -> EffectStatus:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(db)))
    try:
        effect = await ledger.store.find(ledger.idem_key(call))
        assert effect is not None
        return effect.status
    finally:
        await ledger.store.close()


async def _park_both(db: Path) -> tuple[str, str]:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(db)))
    try:
        keys = []
        for call in (PAY, REFUND):
            with pytest.raises(ApprovalPendingError):
                await ledger.run(call, lambda e: "never", PARK)
            keys.append(ledger.idem_key(call))
        effect = await ledger.store.find(keys[1])
        assert effect is not None
        token = sign_link(
            SECRET.encode(),
            idem_key=keys[1],
            intent_hash=effect_intent(effect, None),
            action=DecisionAction.APPROVE,
            principal="alice",
            ttl=timedelta(hours=1),
        )
        return keys[0], token
    finally:
        await ledger.store.close()


def _now_status(db: Path, call: ToolCall) -> EffectStatus:
    """The effect's status, read on a thread of its own (Playwright's sync API keeps
    an event loop running on this one)."""
    found: list[EffectStatus] = []
    reader = threading.Thread(target=lambda: found.append(asyncio.run(_status(db, call))))
    reader.start()
    reader.join(30)
    return found[0]


class _Waiter(threading.Thread):
    """A worker whose run() waits for the person's decision, then pays."""

    def __init__(self, db: Path) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.result: object = None

    def run(self) -> None:
        async def wait() -> object:
            ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(self.db)))
            try:
                return await ledger.run(PAY, lambda e: {"paid": e.args["cents"]})
            finally:
                await ledger.store.close()

        self.result = asyncio.run(wait())


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    db = tmp_path / "ledger.db"
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"alice": hash_password("a-pw"), "bob": hash_password("b-pw")}))
    port = _free_port()
    env = {**os.environ, "AGENT_LEDGER_CONSOLE_SECRET": SECRET}
    env.pop("AGENT_LEDGER_URL", None)
    assert subprocess.run([SCRIPT, "--url", f"sqlite:///{db}", "init"], env=env).returncode == 0
    server = subprocess.Popen(
        [SCRIPT, "--url", f"sqlite:///{db}", "console", "--users", str(users),
         "--allow", "alice:pay*", "--allow", "bob:pay*", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "console did not start"
            time.sleep(0.1)
    try:
        yield base, db
    finally:
        server.terminate()
        server.wait(10)


def _evil_site(target: str, folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Another origin serving a form that posts itself to the console."""
    (folder / "index.html").write_text(
        f'<form method="post" action="{target}"><input name="action" value="approve">'
        '<input name="csrf" value="x"></form><script>document.forms[0].submit()</script>'
    )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://localhost:{server.server_address[1]}/"


def test_a_person_approves_in_a_browser_and_the_waiting_run_returns(
    console: tuple[str, Path], tmp_path: Path
) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install -y chromium)")
    base, db = console
    key, token = asyncio.run(_park_both(db))
    waiter = _Waiter(db)
    waiter.start()
    SHOTS.mkdir(exist_ok=True)
    evil_folder = tmp_path / "evil"
    evil_folder.mkdir()
    evil, evil_url = _evil_site(f"{base}/effects/{key}/decide", evil_folder)
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                alice = browser.new_context(
                    http_credentials={"username": "alice", "password": "a-pw"}
                )
                bob = browser.new_context(http_credentials={"username": "bob", "password": "b-pw"})
                for device, width in WIDTHS.items():
                    page = alice.new_page()
                    page.set_viewport_size({"width": width, "height": 900})
                    page.goto(base + "/")
                    assert "wf-browser" in page.content()
                    page.screenshot(
                        path=str(SHOTS / f"console-pending-{device}.png"), full_page=True
                    )
                    page.goto(f"{base}/effects/{key}")
                    page.screenshot(
                        path=str(SHOTS / f"console-receipt-{device}.png"), full_page=True
                    )
                    page.close()
                page = alice.new_page()
                page.goto(base + "/")
                page.get_by_role("link", name="pay").first.click()
                page.goto(f"{base}/effects/{key}")
                args = page.locator("#args").inner_text()
                assert json.loads(args) == {"cents": 12500, "to": "acme"}
                stale = bob.new_page()
                stale.goto(f"{base}/effects/{key}")
                # Another origin's self-submitting form: refused, nothing changes.
                attack = alice.new_page()
                attack.goto(evil_url)
                attack.wait_for_load_state()
                assert "A form from another site may not decide" in attack.content()
                assert _now_status(db, PAY) is EffectStatus.REQUIRES_APPROVAL
                page.get_by_role("button", name="Approve").click()
                page.wait_for_load_state()
                waiter.join(30)
                assert waiter.result == {"paid": 12500}
                stale.get_by_role("button", name="Approve").click()
                stale.wait_for_load_state()
                assert "already decided by alice at" in stale.content()
                # A link: its GET (a mail scanner) changes nothing; its POST decides.
                link = bob.new_page()
                link.goto(f"{base}/links/{token}")
                link.goto(f"{base}/links/{token}")
                assert _now_status(db, REFUND) is EffectStatus.REQUIRES_APPROVAL
                link.get_by_role("button").click()
                link.wait_for_load_state()
                assert "approved by alice" in link.content()
                assert _now_status(db, REFUND) is EffectStatus.READY
            finally:
                browser.close()
    finally:
        evil.shutdown()
        evil.server_close()
