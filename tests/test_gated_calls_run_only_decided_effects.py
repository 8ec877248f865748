"""A call that needs approval runs only an effect a person decided (issue 28, R01).

Whoever can write the ledger's rows (a worker login under PostgreSQL's role
set, any process on SQLite) might pre-insert a call's key as a stale
``processing`` effect, or as ``ready`` with nobody's decision: an honest
``run(requires_approval=True)`` must then send it to a person (fenced, as a
holder releases) rather than take it over or claim it and run the tool.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.keys import canonical_json
from agent_ledger.options import StaleOptions
from agent_ledger.stores.sqlite import SqliteStore
from agent_ledger.testing import build_ledger

GATED = RunOptions(
    requires_approval=True, wait_for_approval=False, stale=StaleOptions(after_ms=1_000)
)
PAY = ToolCall(workflow_id="wf-gated", tool="payments.send", args={"to": "mallory", "cents": 99})


@pytest.mark.parametrize("status", ["processing", "ready"])
async def test_a_raw_undecided_row_is_sent_for_approval_not_run(
    tmp_path: Path, status: str
) -> None:
    db = tmp_path / "ledger.db"
    store = SqliteStore(db)
    try:
        ledger = build_ledger(store)
        assert await ledger.run(ToolCall(workflow_id="w", tool="t", args={}), lambda e: 1) == 1
        key = ledger.idem_key(PAY)
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute(
                "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, tool, status,"
                " args_canonical, created_us, updated_us, heartbeat_us, lease_ms, executions)"
                " VALUES ('00000000-0000-4000-8000-000000000001', ?, ?, ?, ?, ?, 1, 1, 1, 1, ?)",
                (
                    key,
                    PAY.workflow_id,
                    PAY.tool,
                    status,
                    canonical_json(PAY.args, field="args").decode(),
                    1 if status == "processing" else 0,
                ),
            )
            conn.commit()
        ran: list[int] = []

        def pay(effect: object) -> str:
            ran.append(1)
            return "paid"

        with pytest.raises(ApprovalPendingError):
            await ledger.run(PAY, pay, GATED)
        assert ran == []
        waiting = await store.find(key)
        assert waiting is not None and waiting.status is EffectStatus.REQUIRES_APPROVAL
        # A person approves: now it runs, once.
        assert await ledger.approve(key, by="alice")
        assert await ledger.run(PAY, pay, GATED) == "paid"
        assert ran == [1]
    finally:
        await store.close()


async def test_an_approved_effect_still_runs_and_an_ungated_call_still_takes_over(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "ledger.db")
    try:
        ledger = build_ledger(store)
        with pytest.raises(ApprovalPendingError):
            await ledger.run(PAY, lambda e: "paid", GATED)
        # approve with no name still carries a decision (decided_at).
        assert await ledger.approve(ledger.idem_key(PAY))
        assert await ledger.run(PAY, lambda e: "paid", GATED) == "paid"
    finally:
        await store.close()
