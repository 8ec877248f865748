"""Hooks and approval policies are checked when the ledger is built: a sync approval hook
runs, and hooks or policies of the wrong kind are refused before anything is stored."""

from __future__ import annotations

import logging

import pytest

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    LedgerHooks,
    MemoryStore,
    RunOptions,
    ToolCall,
)
from agent_ledger.options import ConcurrencyOptions


async def test_a_sync_approval_hook_runs_and_is_not_reported_as_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    def notify(effect: Effect) -> None:
        seen.append(effect.status.value)

    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    with caplog.at_level(logging.WARNING, logger="agent_ledger"):
        hooks = LedgerHooks(on_approval_required=notify)
        other = ToolCall(workflow_id="wf", tool="refund", args={"cents": 6})
        options = RunOptions(
            requires_approval=True,
            concurrency=ConcurrencyOptions(approval_timeout_ms=10),
        )
        with pytest.raises(Exception, match="approval"):
            await ledger.run(other, lambda e: "ok", options, hooks=hooks)
    assert seen == ["requires_approval"]
    assert not [r for r in caplog.records if "hook raised" in r.getMessage()]


@pytest.mark.parametrize("name", ["requires_approval", "on_approval_required"])
def test_hooks_that_are_not_callable_are_refused_at_once(name: str) -> None:
    with pytest.raises(EffectLedgerValidationError, match=name) as info:
        LedgerHooks(**{name: "yes please"})  # type: ignore[arg-type]
    assert info.value.field == name


async def test_hooks_of_the_wrong_type_are_refused_before_anything_is_stored() -> None:
    store = MemoryStore()
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    call = ToolCall(workflow_id="wf", tool="t")
    with pytest.raises(EffectLedgerValidationError, match="hooks must be a LedgerHooks"):
        await ledger.run(call, lambda e: 1, hooks={})  # type: ignore[call-overload]
    assert len(store) == 0


def test_an_async_approval_policy_is_refused() -> None:
    """A coroutine is truthy: an async policy would gate every call."""

    async def policy(call: ToolCall) -> bool:
        return False

    with pytest.raises(EffectLedgerValidationError, match="not an async def"):
        LedgerHooks(requires_approval=policy)  # type: ignore[arg-type]


async def test_a_policy_returning_an_awaitable_is_refused_before_anything_is_stored() -> None:
    async def decide(call: ToolCall) -> bool:
        return False

    store = MemoryStore()
    hooks = LedgerHooks(requires_approval=lambda call: decide(call))  # type: ignore[arg-type,return-value]
    ledger = EffectLedger(EffectLedgerOptions(store=store, hooks=hooks))
    with pytest.raises(EffectLedgerValidationError, match="returned an awaitable"):
        await ledger.run(ToolCall(workflow_id="wf", tool="t"), lambda e: 1)
    assert len(store) == 0
