"""`agent-ledger approve/deny` decide through the audited path (channel ``cli``, the
principal from ``--by`` or the OS user); `agent-ledger sweep` denies approvals past
their deadline (SQLite file, real script)."""

from __future__ import annotations

import asyncio
import getpass
import json
from pathlib import Path

import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerOptions,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from tests.cli.conftest import Cli

PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 700}, workflow_id="wf-cli-audit")


async def _pending(db: Path, call: ToolCall, deadline_ms: int | None = None) -> str:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(db)))
    gated = RunOptions(
        requires_approval=True, wait_for_approval=False, approval_deadline_ms=deadline_ms
    )
    try:
        with pytest.raises(ApprovalPendingError):
            await ledger.run(call, lambda e: "paid", gated)
        return ledger.idem_key(call)
    finally:
        await ledger.store.close()


def _trail(cli: Cli) -> list[tuple[str, str, str, str, str]]:
    out = cli("export", "--decision-attempts", "--format", "json")
    assert out.returncode == 0, out.stderr
    return [
        (r["principal"], r["channel"], r["action"], r["outcome"], r["reason_code"])
        for r in json.loads(out.stdout)
    ]


async def test_cli_decisions_are_in_the_audit_trail(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    key = await _pending(db, PAY)
    other = await _pending(db, ToolCall(tool="pay", args={"to": "b"}, workflow_id="wf-cli-audit"))
    cli = Cli(f"sqlite:///{db}", tmp_path)
    assert cli("approve", key[:12], "--by", "carol", "--note", "ok").returncode == 0
    again = cli("approve", key[:12])  # already decided: refused, audited as the OS user
    assert again.returncode != 0 and "cannot approve" in again.stderr
    assert cli("deny", other[:12], "--reason", "no").returncode == 0
    me = getpass.getuser()
    assert _trail(cli) == [
        ("carol", "cli", "approve", "accepted", "decided"),
        (me, "cli", "approve", "refused", "already_decided"),
        (me, "cli", "deny", "accepted", "decided"),
    ]
    shown = json.loads(cli("show", other[:12], "--json").stdout)
    assert shown["decided_by"] == me


async def test_sweep_denies_approvals_past_their_deadline(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    key = await _pending(db, PAY, deadline_ms=1)
    cli = Cli(f"sqlite:///{db}", tmp_path)
    await asyncio.sleep(0.01)
    late = cli("approve", key[:12], "--by", "carol")
    assert late.returncode != 0 and "deadline has passed" in late.stderr
    # The refused approval denied it as expired; the sweep finds nothing more.
    assert json.loads(cli("show", key[:12], "--json").stdout)["status"] == "denied"
    assert "no approval is past its deadline" in cli("sweep").stdout
    assert _trail(cli) == [("carol", "cli", "approve", "refused", "expired")]
    second = await _pending(db, ToolCall(tool="pay", args={"n": 2}, workflow_id="w"), 1)
    await asyncio.sleep(0.01)
    swept = cli("sweep")
    assert swept.returncode == 0 and f"expired pay ({second[:12]})" in swept.stdout
    record = json.loads(cli("show", second[:12], "--json").stdout)
    assert record["status"] == "denied" and record["error_code"] == "expired"
