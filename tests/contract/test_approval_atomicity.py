"""An approval-gated effect is born waiting for a person (issue 10, item 2).

It used to be inserted as processing and moved to requires_approval by a
second statement; a crash, error or cancellation between the two left a
processing effect that the next caller took over and ran, unapproved.
"""

from __future__ import annotations

import pytest

from agent_ledger import Effect, EffectStatus, EffectStoreError, RunOptions, ToolCall
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.testing import FaultyStore, build_ledger
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="payments.refund", args={"cents": 50_000})
GATED = RunOptions(
    requires_approval=True,
    stale=StaleOptions(after_ms=1_000),
    concurrency=ConcurrencyOptions(approval_timeout_ms=50, wait_timeout_ms=50),
)


async def test_the_effect_is_inserted_waiting_for_approval(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, lambda e: "refunded", GATED)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None
    assert (effect.status, effect.attempt) == (EffectStatus.REQUIRES_APPROVAL, 1)


async def test_a_lost_begin_reply_never_runs_the_handler_unapproved(
    harness: StoreHarness,
) -> None:
    """The insert lands, its reply is lost; long after any lease, a retry must still wait."""
    store = FaultyStore(harness.store)
    store.fail("begin", when="after")
    ledger = build_ledger(store)
    ran: list[int] = []

    def refund(effect: Effect) -> str:
        ran.append(effect.attempt)
        return "ok"

    with pytest.raises(EffectStoreError):
        await ledger.run(CALL, refund, GATED)
    await harness.age(60 * 60 * 1000)
    with pytest.raises(EffectTimeoutError):
        await ledger.run(CALL, refund, GATED)
    assert ran == []
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    assert await ledger.approve(effect.idem_key, by="ops")
    assert await ledger.run(CALL, refund, GATED) == "ok"
    assert ran == [2]
