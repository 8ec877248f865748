"""Concurrent uses of one signed link: one decides, and every other is told (and
audited) ``link_used`` on every store. MariaDB used to check the nonce before
the settle and wait on the effect's row, so its losers said ``already_decided``
while PostgreSQL and SQLite said ``link_used``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.approvals import Channel, DecisionAction, NewDecisionAttempt, UsedLink
from agent_ledger.deciding import approval_store, effect_intent
from agent_ledger.stores.approval_base import DecideRequest
from agent_ledger.stores.base import Decision
from tests.harness import StoreHarness

pytestmark = pytest.mark.every_store

PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 7}, workflow_id="wf-link-race")
USERS = 6


async def test_every_concurrent_use_but_one_is_link_used(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    with pytest.raises(ApprovalPendingError):
        await ledger.run(
            PAY, lambda e: "paid", RunOptions(requires_approval=True, wait_for_approval=False)
        )
    effect = await harness.store.find(ledger.idem_key(PAY))
    assert effect is not None
    shown = effect_intent(effect, None)
    link = UsedLink("c" * 32, DecisionAction.APPROVE, datetime.now(UTC) + timedelta(hours=1))
    approvals = approval_store(harness.store)

    def use(n: int) -> DecideRequest:
        attempt = NewDecisionAttempt(
            effect.idem_key, "alice", Channel.LINK, DecisionAction.APPROVE, shown, f"use {n}"
        )
        return DecideRequest(
            effect.idem_key,
            EffectStatus.READY,
            Decision(by="alice", note=f"use {n}"),
            attempt,
            expected_attempt=effect.attempt,
            link=link,
        )

    outcomes = await asyncio.gather(*(approvals.decide(use(n)) for n in range(USERS)))
    winners = [o for o in outcomes if o.effect is not None]
    assert len(winners) == 1
    assert [o.link_used for o in outcomes if o.effect is None] == [True] * (USERS - 1)
    stored = await harness.store.find(effect.idem_key)
    assert stored is not None and stored.status is EffectStatus.READY
    assert len(await approvals.decision_attempts(effect.idem_key)) == 1
