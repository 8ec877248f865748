"""An effect sent to a person records its request (who asked, the policy's version,
a deadline) by the caller whose step sent it, once per request; a run that needs
no person records nothing."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agent_ledger import (
    EffectLedgerValidationError,
    EffectStatus,
    LedgerHooks,
    RunOptions,
    ToolCall,
)
from agent_ledger.approvals import ApprovalRequest
from agent_ledger.deciding import approval_store
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.stores.memory import MemoryStore
from agent_ledger.testing import build_ledger
from tests.approvals import make_pending
from tests.harness import StoreHarness

PAY = ToolCall(workflow_id="wf-req", tool="pay", args={"to": "acme", "cents": 1200})
ASKED = RunOptions(principal="agent-7", approval_deadline_ms=3_600_000)
VERSIONED = LedgerHooks(approval_policy_version="payments-v3")


async def test_a_gated_run_records_who_asked_the_policy_version_and_the_deadline(
    harness: StoreHarness,
) -> None:
    ledger = build_ledger(harness.store, defaults=ASKED, hooks=VERSIONED)
    effect = await make_pending(ledger, PAY)
    request = await approval_store(harness.store).approval_request(effect.idem_key)
    assert request is not None
    assert (request.requested_by, request.policy_version) == ("agent-7", "payments-v3")
    assert request.deadline_at is not None and request.escalated_at is None
    # PostgreSQL reads its clock once per expression: a microsecond apart at most.
    assert abs(request.deadline_at - request.created_at - timedelta(hours=1)) < timedelta(
        milliseconds=10
    )
    # Asked again by another caller: the effect already waits; nothing is recorded again.
    again = build_ledger(
        harness.store, defaults=RunOptions(principal="agent-9", approval_deadline_ms=5)
    )
    await make_pending(again, PAY)
    assert await approval_store(harness.store).approval_request(effect.idem_key) == request


async def test_a_run_that_needs_no_person_records_no_request(harness: StoreHarness) -> None:
    ledger = build_ledger(harness.store, defaults=ASKED, hooks=VERSIONED)
    assert await ledger.run(PAY, lambda e: "paid") == "paid"
    key = ledger.idem_key(PAY)
    assert await approval_store(harness.store).approval_request(key) is None


async def test_the_policy_hook_sending_a_call_to_a_person_records_the_request(
    harness: StoreHarness,
) -> None:
    hooks = LedgerHooks(requires_approval=lambda call: True, approval_policy_version="p1")
    ledger = build_ledger(harness.store, defaults=RunOptions(principal="bot"), hooks=hooks)
    wait0 = RunOptions(concurrency=ConcurrencyOptions(approval_timeout_ms=0))
    with pytest.raises(Exception, match="approval"):
        await ledger.run(PAY, lambda e: "paid", wait0)
    request = await approval_store(harness.store).approval_request(ledger.idem_key(PAY))
    assert request is not None and (request.requested_by, request.policy_version) == ("bot", "p1")
    assert request.deadline_at is None


async def test_an_approval_taken_back_is_a_new_request(harness: StoreHarness) -> None:
    ledger = build_ledger(harness.store, defaults=ASKED)
    effect = await make_pending(ledger, PAY)
    first = await approval_store(harness.store).approval_request(effect.idem_key)
    assert await ledger.approve(effect.idem_key, by="ops")
    later = build_ledger(harness.store, defaults=RunOptions(principal="auditor"))
    await harness.age(5)
    assert await later.request_approval(effect.idem_key)
    renewed = await approval_store(harness.store).approval_request(effect.idem_key)
    assert first is not None and renewed is not None
    assert renewed.requested_by == "auditor" and renewed.deadline_at is None
    assert renewed.created_at >= first.created_at
    found = await harness.store.find(effect.idem_key)
    assert found is not None and found.status is EffectStatus.REQUIRES_APPROVAL


def test_bad_request_options_are_refused_by_name() -> None:
    for bad, field in (
        (lambda: RunOptions(principal=""), "principal"),
        (lambda: RunOptions(principal=7), "principal"),  # type: ignore[arg-type]
        (lambda: RunOptions(approval_deadline_ms=0), "approval_deadline_ms"),
        (lambda: RunOptions(approval_deadline_ms=1.5), "approval_deadline_ms"),  # type: ignore[arg-type]
        (lambda: LedgerHooks(approval_policy_version=""), "approval_policy_version"),
        (lambda: LedgerHooks(escalate_after=1), "escalate_after"),
        (lambda: LedgerHooks(escalate_after=0), "escalate_after"),
        (lambda: LedgerHooks(on_approval_escalation="page"), "on_approval_escalation"),  # type: ignore[arg-type]
    ):
        with pytest.raises(EffectLedgerValidationError) as caught:
            bad()
        assert caught.value.field == field


class _SlowRequests(MemoryStore):
    """Holds each request's note until told to go on (a slow statement)."""

    def __init__(self) -> None:
        super().__init__()
        self.noting = asyncio.Event()
        self.go_on = asyncio.Event()

    async def renew_request(
        self,
        idem_key: str,
        *,
        requested_by: str | None,
        policy_version: str | None,
        deadline_ms: int | None,
    ) -> ApprovalRequest:
        self.noting.set()
        await self.go_on.wait()
        return await super().renew_request(
            idem_key,
            requested_by=requested_by,
            policy_version=policy_version,
            deadline_ms=deadline_ms,
        )


async def test_a_caller_cancelled_while_noting_its_request_still_records_it() -> None:
    store = _SlowRequests()
    ledger = build_ledger(store, defaults=ASKED)
    run = asyncio.create_task(ledger.run(PAY, lambda e: "paid", RunOptions(requires_approval=True)))
    await store.noting.wait()
    run.cancel()
    await asyncio.sleep(0)  # the cancellation lands while the statement is in flight
    store.go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    request = await store.approval_request(ledger.idem_key(PAY))
    assert request is not None and request.requested_by == "agent-7"
    assert request.deadline_at is not None
