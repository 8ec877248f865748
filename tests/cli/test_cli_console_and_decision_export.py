"""`agent-ledger console` serves the approval console; `agent-ledger export
--decision-attempts` writes the decision audit trail (SQLite file, real script)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerOptions,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.approvals import Channel, DecisionAction
from agent_ledger.console import hash_password
from agent_ledger.deciding import decide
from tests.cli.conftest import SCRIPT, Cli

PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 700}, workflow_id="wf-cli")


async def _park(db: Path) -> str:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(db)))
    try:
        with pytest.raises(ApprovalPendingError):
            await ledger.run(
                PAY, lambda e: "paid", RunOptions(requires_approval=True, wait_for_approval=False)
            )
        return ledger.idem_key(PAY)
    finally:
        await ledger.store.close()


async def test_export_writes_every_decision_attempt(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    key = await _park(db)
    store = SqliteStore(db)
    try:
        for who in ("ops-bot", "carol"):  # one refused (no intent shown), one accepted
            await decide(
                store,
                key,
                action=DecisionAction.APPROVE,
                principal=who,
                channel=Channel.SLACK if who == "ops-bot" else Channel.CLI,
                shown_intent=None,
            )
    finally:
        await store.close()
    cli = Cli(f"sqlite:///{db}", tmp_path)
    out = cli("export", "--decision-attempts", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["principal"], r["channel"], r["outcome"], r["reason_code"]) for r in rows] == [
        ("ops-bot", "slack", "refused", "intent_mismatch"),
        ("carol", "cli", "accepted", "decided"),
    ]
    csv_out = cli("export", "--decision-attempts", "--format", "csv")
    assert csv_out.stdout.splitlines()[0].startswith("id,idem_key,principal,channel")
    assert cli("export", "--decision-attempts", "--format", "md").returncode != 0
    # To a file, as the effects' export writes one: the count said on stderr.
    target = tmp_path / "attempts.jsonl"
    written = cli("export", "--decision-attempts", "--format", "jsonl", "-o", str(target))
    assert written.returncode == 0 and written.stdout == ""
    assert written.stderr == f"exported 2 decision attempts to {target}\n"
    assert [json.loads(line)["principal"] for line in target.read_text().splitlines()] == [
        "ops-bot",
        "carol",
    ]


def test_the_console_command_refuses_without_identity_or_rules(tmp_path: Path) -> None:
    cli = Cli(f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path)
    assert cli("init").returncode == 0
    none = cli("console", "--allow", "alice:*")
    assert none.returncode != 0 and "--users FILE or --proxy-header" in none.stderr
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"alice": hash_password("pw")}))
    no_rules = cli("console", "--users", str(users))
    assert no_rules.returncode != 0 and "--allow" in no_rules.stderr
    untrusted = cli("console", "--proxy-header", "X-User", "--allow", "a:*")
    assert untrusted.returncode != 0 and "--trusted-proxy" in untrusted.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_console_command_serves_the_pending_list(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    await _park(db)
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"alice": hash_password("pw")}))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "AGENT_LEDGER_URL"}
    env["AGENT_LEDGER_CONSOLE_SECRET"] = "s" * 32
    server = subprocess.Popen(
        [SCRIPT, "--url", f"sqlite:///{db}", "console", "--users", str(users),
         "--allow", "alice:pay*", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        auth = {"Authorization": "Basic " + base64.b64encode(b"alice:pw").decode()}
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            while True:
                try:
                    page = await client.get("/", headers=auth)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise
                    await asyncio.sleep(0.1)
            assert (await client.get("/")).status_code == 401
        assert page.status_code == 200 and "wf-cli" in page.text and "pay" in page.text
    finally:
        server.terminate()
        server.wait(10)
