"""An approved effect runs only if what would run is what the approval was bound to
(tool, workflow, canonical args, policy version). Otherwise nothing runs: the
refusal is audited (``intent_mismatch``), a new request is recorded, and the
effect goes back to a person."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from agent_ledger import (
    ApprovalPendingError,
    Effect,
    EffectStatus,
    LedgerHooks,
    RunOptions,
    ToolCall,
)
from agent_ledger.approvals import DecisionOutcome
from agent_ledger.codes import DecisionCode
from agent_ledger.deciding import RUN_PRINCIPAL, approval_store
from agent_ledger.errors import ApprovalIntentChangedError
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.testing import build_ledger
from tests.approvals import make_pending
from tests.harness import StoreHarness

PAY = ToolCall(workflow_id="wf-intent", tool="pay", args={"to": "acme", "cents": 500})
NO_WAIT = RunOptions(wait_for_approval=False)


def paying(ran: list[str]) -> Callable[[Effect], str]:
    """A handler that notes each run (of the args it got) and pays."""

    def pay(effect: Effect) -> str:
        ran.append(effect.args_canonical)
        return "paid"

    return pay


async def test_a_policy_version_changed_since_the_approval_sends_it_back_to_a_person(
    harness: StoreHarness,
) -> None:
    old = build_ledger(harness.store, hooks=LedgerHooks(approval_policy_version="v1"))
    effect = await make_pending(old, PAY)
    assert await old.approve(effect.idem_key, by="ops")
    new = build_ledger(harness.store, hooks=LedgerHooks(approval_policy_version="v2"))
    ran: list[str] = []
    with pytest.raises(ApprovalPendingError):
        await new.run(PAY, paying(ran), NO_WAIT)
    assert ran == []
    back = await harness.store.find(effect.idem_key)
    assert back is not None and back.status is EffectStatus.REQUIRES_APPROVAL
    assert back.executions == 0
    approvals = approval_store(harness.store)
    request = await approvals.approval_request(effect.idem_key)
    assert request is not None and request.policy_version == "v2"
    refused = (await approvals.decision_attempts(effect.idem_key))[-1]
    assert (refused.principal, refused.outcome, refused.reason_code) == (
        RUN_PRINCIPAL,
        DecisionOutcome.REFUSED,
        DecisionCode.INTENT_MISMATCH,
    )
    # Approved again, under v2 this time: it runs, once.
    assert await new.approve(effect.idem_key, by="ops")
    assert await new.run(PAY, paying(ran)) == "paid"
    assert ran == [effect.args_canonical]


async def test_the_same_policy_runs_what_was_approved(harness: StoreHarness) -> None:
    ledger = build_ledger(harness.store, hooks=LedgerHooks(approval_policy_version="v1"))
    effect = await make_pending(ledger, PAY)
    assert await ledger.approve(effect.idem_key, by="ops")
    assert await ledger.run(PAY, lambda e: "paid") == "paid"
    trail = await approval_store(harness.store).decision_attempts(effect.idem_key)
    assert [a.reason_code for a in trail] == [DecisionCode.DECIDED]


async def test_args_changed_under_an_approval_never_run() -> None:
    """Another writer with the database's credentials edits an approved effect's args."""
    store = MemoryStore()
    ledger = build_ledger(store)
    effect = await make_pending(ledger, PAY)
    assert await ledger.approve(effect.idem_key, by="ops")
    row = store._rows[effect.idem_key]  # the back door: what a direct UPDATE would do
    row.args_canonical = row.args_canonical.replace("acme", "mallory")
    ran: list[str] = []
    waiting = asyncio.create_task(ledger.run(PAY, paying(ran)))
    for _ in range(200):
        found = await store.find(effect.idem_key)
        assert found is not None
        if found.status is EffectStatus.REQUIRES_APPROVAL:
            break
        await asyncio.sleep(0.005)
    assert ran == [] and found is not None and found.status is EffectStatus.REQUIRES_APPROVAL
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    trail = await approval_store(store).decision_attempts(effect.idem_key)
    assert trail[-1].reason_code is DecisionCode.INTENT_MISMATCH


async def test_inside_a_transaction_a_changed_intent_raises_and_nothing_runs(
    harness: StoreHarness,
) -> None:
    old = build_ledger(harness.store, hooks=LedgerHooks(approval_policy_version="v1"))
    effect = await make_pending(old, PAY)
    assert await old.approve(effect.idem_key, by="ops")
    new = build_ledger(harness.store, hooks=LedgerHooks(approval_policy_version="v2"))
    with pytest.raises(ApprovalIntentChangedError, match="policy version"):
        async with harness.store.transaction() as tx:
            await new.run(PAY, lambda e: "paid", tx=tx)
    after = await harness.store.find(effect.idem_key)
    assert after is not None and after.status is EffectStatus.READY  # the claim rolled back
    assert dataclasses.replace(after).executions == 0
