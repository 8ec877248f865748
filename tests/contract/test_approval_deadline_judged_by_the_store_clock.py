"""Past an approval's deadline nobody approves it, whatever this process's clock says (s03).

The deadline is set by the store's clock (the database's, on PostgreSQL and
MariaDB). ``decide()`` reads its own clock first, but the store's settle
itself refuses an approval past the deadline by the store's clock, and the
refusal is the ``expired`` outcome: the effect is denied as expired. A clock
running ahead of the store's does not expire an approval early either.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.approvals import Channel, DecisionAction
from agent_ledger.codes import DecisionCode, ErrorCode
from agent_ledger.deciding import DecisionResult, approval_store, decide, effect_intent
from tests.harness import StoreHarness

GATED = RunOptions(requires_approval=True, wait_for_approval=False)


async def _waiting(harness: StoreHarness, n: int, deadline_ms: int) -> str:
    ledger = harness.ledger()
    call = ToolCall(workflow_id="wf-skew", tool="payments.send", args={"n": n})
    with pytest.raises(ApprovalPendingError):
        await ledger.run(call, lambda e: 1, GATED)
    key = ledger.idem_key(call)
    await approval_store(harness.store).renew_request(
        key, requested_by="agent", policy_version=None, deadline_ms=deadline_ms
    )
    return key


async def _approve(harness: StoreHarness, key: str, now: datetime) -> DecisionResult:
    store = harness.store
    effect = await store.find(key)
    assert effect is not None
    request = await approval_store(store).approval_request(key)
    return await decide(
        store,
        key,
        action=DecisionAction.APPROVE,
        principal="alice",
        channel=Channel.CONSOLE,
        shown_intent=effect_intent(effect, request),
        now=now,
    )


async def test_an_approval_past_the_stores_deadline_is_expired_even_if_this_clock_lags(
    harness: StoreHarness,
) -> None:
    key = await _waiting(harness, 1, deadline_ms=1)
    await asyncio.sleep(0.05)  # the database's clock
    await harness.age(1_000)  # the embedded stores' (manual) clock
    # This process's clock an hour behind: it thinks the deadline is ahead.
    outcome = await _approve(harness, key, datetime.now(UTC) - timedelta(hours=1))
    assert not outcome.accepted and outcome.reason is DecisionCode.EXPIRED
    effect = await harness.store.find(key)
    assert effect is not None and effect.status is EffectStatus.DENIED
    assert effect.error is not None and effect.error.code == ErrorCode.APPROVAL_EXPIRED


async def test_a_clock_running_ahead_does_not_expire_an_approval_early(
    harness: StoreHarness,
) -> None:
    key = await _waiting(harness, 2, deadline_ms=3_600_000)
    outcome = await _approve(harness, key, datetime.now(UTC) + timedelta(hours=2))
    assert outcome.accepted
    effect = await harness.store.find(key)
    assert effect is not None and effect.status is EffectStatus.READY
