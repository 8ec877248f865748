"""Approval flows: waiting for a human, policy hooks, notifications and races."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent_ledger import (
    Effect,
    EffectDeniedError,
    EffectLedgerValidationError,
    EffectStatus,
    LedgerHooks,
    RunOptions,
    ToolCall,
)
from agent_ledger.effects import CommitSucceeded
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from tests.approvals import make_pending
from tests.harness import StoreHarness

DEPLOY = ToolCall(workflow_id="release-9", tool="k8s.deploy", args={"image": "app:v2"})
APPROVAL = RunOptions(
    requires_approval=True,
    concurrency=ConcurrencyOptions(initial_interval_ms=5, max_interval_ms=20),
)


async def wait_for_status(harness: StoreHarness, key: str, status: EffectStatus) -> Effect:
    for _ in range(400):
        effect = await harness.store.find(key)
        if effect is not None and effect.status is status:
            return effect
        await asyncio.sleep(0.005)
    raise AssertionError(f"effect never reached {status}")


async def test_approved_run_executes_once_after_approval(harness: StoreHarness) -> None:
    """run() waits in requires_approval; approve() lets it run the handler exactly once."""
    ledger = harness.ledger()
    ran: list[int] = []

    async def deploy(effect: Effect) -> str:
        ran.append(effect.attempt)
        return "deployed"

    task = asyncio.create_task(ledger.run(DEPLOY, deploy, APPROVAL))
    key = ledger.idem_key(DEPLOY)
    pending = await wait_for_status(harness, key, EffectStatus.REQUIRES_APPROVAL)
    assert (pending.executions, pending.started_at) == (0, None)
    assert ran == []
    assert await ledger.approve(key)
    assert await asyncio.wait_for(task, 5) == "deployed"
    assert ran == [2]  # the claim from ready is a new attempt
    assert await ledger.run(DEPLOY, deploy, APPROVAL) == "deployed"
    assert ran == [2]
    # One execution, though two attempts; it started after the decision.
    done = await harness.store.find(key)
    assert done is not None and (done.executions, done.attempt) == (1, 2)
    assert done.decided_at is not None and done.started_at is not None
    assert done.decided_at <= done.started_at <= (done.completed_at or done.started_at)


async def test_denied_run_raises_with_the_reason(harness: StoreHarness) -> None:
    """deny() ends the wait with EffectDeniedError and the handler never runs."""
    ledger = harness.ledger()
    task = asyncio.create_task(ledger.run(DEPLOY, lambda e: "never", APPROVAL))
    key = ledger.idem_key(DEPLOY)
    await wait_for_status(harness, key, EffectStatus.REQUIRES_APPROVAL)
    assert await ledger.deny(key, reason="change freeze")
    with pytest.raises(EffectDeniedError, match="change freeze"):
        await asyncio.wait_for(task, 5)


async def test_approve_and_deny_race_has_one_winner(harness: StoreHarness) -> None:
    """Concurrent approve() and deny() on one effect: exactly one returns True."""
    for round_ in range(20):
        ledger = harness.ledger()
        call = ToolCall(workflow_id=f"race-{round_}", tool="t")
        key = (await make_pending(ledger, call)).idem_key
        approved, denied = await asyncio.gather(ledger.approve(key), ledger.deny(key))
        assert approved != denied
        effect = await ledger.find_by_idem_key(key)
        assert effect is not None
        assert effect.status is (EffectStatus.READY if approved else EffectStatus.DENIED)


async def test_policy_hook_decides_for_fresh_calls_only(harness: StoreHarness) -> None:
    """requires_approval hook: applied when the effect is created, ignored on replays."""
    asked: list[str] = []

    def policy(call: ToolCall) -> bool:
        asked.append(call.tool)
        return call.tool.startswith("k8s.")

    ledger = harness.ledger()
    hooks = LedgerHooks(requires_approval=policy)
    assert (
        await ledger.run(ToolCall(workflow_id="w", tool="slack.post"), lambda e: 1, hooks=hooks)
        == 1
    )
    task = asyncio.create_task(
        ledger.run(DEPLOY, lambda e: 2, RunOptions(concurrency=APPROVAL.concurrency), hooks=hooks)
    )
    await wait_for_status(harness, ledger.idem_key(DEPLOY), EffectStatus.REQUIRES_APPROVAL)
    await ledger.approve(ledger.idem_key(DEPLOY))
    assert await asyncio.wait_for(task, 5) == 2
    # A replay of the approved-and-done effect does not wait again.
    assert await ledger.run(DEPLOY, lambda e: 3, hooks=hooks) == 2


async def test_policy_hook_error_stores_nothing(harness: StoreHarness) -> None:
    """A policy that raises aborts run() before anything is written."""

    def broken(call: ToolCall) -> bool:
        raise RuntimeError("policy service down")

    ledger = harness.ledger()
    with pytest.raises(RuntimeError, match="policy service down"):
        await ledger.run(DEPLOY, lambda e: 1, hooks=LedgerHooks(requires_approval=broken))
    assert await harness.raw_count() == 0


async def test_on_approval_required_fires_once(harness: StoreHarness) -> None:
    """The notification hook runs once per effect entering requires_approval, not per waiter."""
    notified: list[Effect] = []

    async def notify(effect: Effect) -> None:
        notified.append(effect)

    ledger = harness.ledger()
    hooks = LedgerHooks(on_approval_required=notify)
    tasks = [
        asyncio.create_task(ledger.run(DEPLOY, lambda e: "ok", APPROVAL, hooks=hooks))
        for _ in range(5)
    ]
    key = ledger.idem_key(DEPLOY)
    await wait_for_status(harness, key, EffectStatus.REQUIRES_APPROVAL)
    await asyncio.sleep(0.05)
    assert len(notified) == 1 and notified[0].status is EffectStatus.REQUIRES_APPROVAL
    await ledger.approve(key)
    assert await asyncio.gather(*tasks) == ["ok"] * 5
    assert len(notified) == 1


async def test_failing_notification_is_logged_and_the_run_goes_on(
    harness: StoreHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception in on_approval_required is logged with the effect and does not abort."""

    async def broken(effect: Effect) -> None:
        raise ConnectionError("pager unreachable")

    ledger = harness.ledger()
    hooks = LedgerHooks(on_approval_required=broken)
    with caplog.at_level(logging.ERROR, logger="agent_ledger"):
        task = asyncio.create_task(ledger.run(DEPLOY, lambda e: "ok", APPROVAL, hooks=hooks))
        key = ledger.idem_key(DEPLOY)
        await wait_for_status(harness, key, EffectStatus.REQUIRES_APPROVAL)
        await ledger.approve(key)
        assert await asyncio.wait_for(task, 5) == "ok"
    [record] = [r for r in caplog.records if "on_approval_required" in r.getMessage()]
    assert record.idem_key == key  # type: ignore[attr-defined]
    assert record.exc_info is not None


async def test_approval_timeout_leaves_the_effect_pending(harness: StoreHarness) -> None:
    """approval_timeout_ms bounds the wait; the effect stays pending for a later run."""
    ledger = harness.ledger()
    options = RunOptions(
        requires_approval=True,
        concurrency=ConcurrencyOptions(approval_timeout_ms=100, initial_interval_ms=10),
    )
    with pytest.raises(EffectTimeoutError, match="approval") as info:
        await ledger.run(DEPLOY, lambda e: "x", options)
    assert info.value.status == "requires_approval"
    key = ledger.idem_key(DEPLOY)
    assert await ledger.approve(key)
    assert await ledger.run(DEPLOY, lambda e: "later") == "later"


async def test_request_approval_refuses_a_running_effect(harness: StoreHarness) -> None:
    """A running handler is not sent back for approval: it runs once and its commit lands
    (issue 10, item 3)."""
    ledger = harness.ledger()
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[int] = []

    async def deploy(effect: Effect) -> str:
        ran.append(effect.attempt)
        started.set()
        await release.wait()
        return "deployed"

    task = asyncio.create_task(ledger.run(DEPLOY, deploy))
    await asyncio.wait_for(started.wait(), 5)
    key = ledger.idem_key(DEPLOY)
    # Not a silent False: the caller learns it cannot gate a running handler.
    with pytest.raises(EffectLedgerValidationError, match="held by another caller"):
        await ledger.request_approval(key)
    running = await ledger.find_by_idem_key(key)
    assert running is not None and running.status is EffectStatus.PROCESSING
    release.set()
    assert await asyncio.wait_for(task, 5) == "deployed"
    effect = await ledger.find_by_idem_key(key)
    assert effect is not None
    assert (effect.status, effect.result, effect.attempt) == (EffectStatus.SUCCEEDED, "deployed", 1)
    assert not await ledger.approve(key)
    assert await ledger.run(DEPLOY, deploy) == "deployed"
    assert ran == [1]


async def test_request_approval_refuses_an_effect_another_begin_owns(
    harness: StoreHarness,
) -> None:
    """A begin() worker's effect may be running too: a caller that is not its holder
    gets an error, and the holder's commit lands (the holder's own request is
    tests/contract/test_holder_requests_approval.py)."""
    begun = await harness.ledger().begin(DEPLOY)
    with pytest.raises(EffectLedgerValidationError, match="held by another caller"):
        await harness.ledger().request_approval(begun.effect.idem_key)
    assert await harness.ledger().commit(
        begun.effect.id, CommitSucceeded(result="done"), attempt=begun.effect.attempt
    )


async def test_request_approval_takes_back_an_unclaimed_approval(harness: StoreHarness) -> None:
    """ready -> requires_approval, the hook is called; approved again, it runs once and
    counts no takeover."""
    from agent_ledger.testing import build_ledger

    notified: list[str] = []

    async def notify(effect: Effect) -> None:
        notified.append(effect.idem_key)

    ledger = build_ledger(harness.store, hooks=LedgerHooks(on_approval_required=notify))
    key = (await make_pending(ledger, DEPLOY)).idem_key
    assert await ledger.approve(key, by="ada")
    assert await ledger.request_approval(key)
    assert not await ledger.request_approval(key)
    assert notified == [key, key]  # when it was created, and when it was sent back
    pending = await ledger.find_by_idem_key(key)
    assert pending is not None and pending.status is EffectStatus.REQUIRES_APPROVAL
    assert await ledger.approve(key, by="grace")
    ran: list[int] = []

    def deploy(effect: Effect) -> str:
        ran.append(effect.attempt)
        return "deployed"

    # max_takeovers=0: counting the second approval as a takeover would fail the effect.
    strict = RunOptions(stale=StaleOptions(max_takeovers=0))
    assert await ledger.run(DEPLOY, deploy, strict) == "deployed"
    assert ran == [2]
    done = await ledger.find_by_idem_key(key)
    assert done is not None and done.decided_by == "grace"


async def test_approval_wakes_a_slow_polling_waiter_at_once(harness: StoreHarness) -> None:
    """A waiter polling every 30 s runs the handler right after approve(), not 30 s later."""
    ledger = harness.ledger()
    slow = RunOptions(
        requires_approval=True,
        concurrency=ConcurrencyOptions(
            initial_interval_ms=30_000, max_interval_ms=30_000, jitter_factor=0
        ),
    )
    task = asyncio.create_task(ledger.run(DEPLOY, lambda e: "deployed", slow))
    key = ledger.idem_key(DEPLOY)
    await wait_for_status(harness, key, EffectStatus.REQUIRES_APPROVAL)
    await asyncio.sleep(0.05)
    assert await ledger.approve(key)
    assert await asyncio.wait_for(task, 2) == "deployed"
