"""The ``requires_approval`` policy hook is asked for fresh calls only, as the guide
and ``LedgerHooks`` say (issue 26, item 9: it was asked on every replay; 0.2.1
asked once)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_ledger import Effect, EffectStatus, LedgerHooks, MemoryStore, RunOptions, ToolCall
from agent_ledger.errors import EffectTimeoutError
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness

CHARGE = ToolCall(workflow_id="order-42", tool="charge", args={"cents": 7_500})
BIG = ToolCall(workflow_id="order-42", tool="charge", args={"cents": 50_000})
NO_WAIT = RunOptions(concurrency=ConcurrencyOptions(approval_timeout_ms=0))


class Policy:
    """Large charges need a person; remembers every call it was asked about."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    def __call__(self, call: ToolCall) -> bool:
        self.asked.append(dict(call.args))
        cents = call.args["cents"]
        assert isinstance(cents, int)
        return cents > 10_000


async def test_three_identical_calls_ask_the_policy_once(harness: StoreHarness) -> None:
    policy = Policy()
    ledger = build_ledger(harness.store, hooks=LedgerHooks(requires_approval=policy))
    ran: list[int] = []

    def charge(effect: Effect) -> str:
        ran.append(effect.attempt)
        return "ch_1"

    assert [await ledger.run(CHARGE, charge) for _ in range(3)] == ["ch_1"] * 3
    begun = await ledger.begin(CHARGE)
    assert begun.cached and begun.cached_result == "ch_1"
    assert policy.asked == [{"cents": 7_500}]
    assert ran == [1]


async def test_a_call_waiting_for_a_person_is_not_asked_again(harness: StoreHarness) -> None:
    """Its effect keeps its own status: repeated calls wait, the policy stays quiet."""
    policy = Policy()
    ledger = build_ledger(harness.store, hooks=LedgerHooks(requires_approval=policy))
    for _ in range(3):
        with pytest.raises(EffectTimeoutError):
            await ledger.run(BIG, lambda effect: "ch_2", NO_WAIT)
    assert policy.asked == [{"cents": 50_000}]
    assert await ledger.approve(ledger.idem_key(BIG))
    assert await ledger.run(BIG, lambda effect: "ch_2") == "ch_2"
    assert policy.asked == [{"cents": 50_000}]


async def test_a_policy_that_raises_still_stores_nothing(harness: StoreHarness) -> None:
    def broken(call: ToolCall) -> bool:
        raise RuntimeError("policy service down")

    ledger = build_ledger(harness.store, hooks=LedgerHooks(requires_approval=broken))
    with pytest.raises(RuntimeError, match="policy service down"):
        await ledger.run(CHARGE, lambda effect: "ch_1")
    assert await harness.raw_count() == 0


class _SeesAPurgedEffect(MemoryStore):
    """The first lookup finds an effect that is purged before the insert: the race a
    fresh call can lose between looking and inserting."""

    def __init__(self) -> None:
        super().__init__()
        self.ghost: Effect | None = None

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        ghost, self.ghost = self.ghost, None
        return ghost if ghost is not None else await super().find(idem_key, tx=tx)


@pytest.mark.parametrize("answer", [True, False])
async def test_a_key_purged_between_lookup_and_insert_is_still_asked(answer: bool) -> None:
    """The insert then creates the effect unasked; the policy is asked at once, and a
    yes sends it to a person before the handler can run."""
    store = _SeesAPurgedEffect()
    seen = build_ledger(store)
    await seen.run(CHARGE, lambda effect: "old")
    store.ghost = await store.find(seen.idem_key(CHARGE))
    store._rows.clear()  # purged behind the caller's back
    asked: list[ToolCall] = []

    def policy(call: ToolCall) -> bool:
        asked.append(call)
        return answer

    ledger = build_ledger(store, hooks=LedgerHooks(requires_approval=policy))
    if answer:
        with pytest.raises(EffectTimeoutError):
            await ledger.run(CHARGE, lambda effect: "new", NO_WAIT)
        effect = await ledger.find_by_idem_key(ledger.idem_key(CHARGE))
        assert effect is not None
        assert (effect.status, effect.executions) == (EffectStatus.REQUIRES_APPROVAL, 0)
    else:
        assert await ledger.run(CHARGE, lambda effect: "new") == "new"
    assert asked == [CHARGE]
