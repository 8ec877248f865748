"""`review` on a parked effect (an ambiguous attempt), every store: it says why the
effect waits, offers resolve, and every decision names the attempt on screen."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from agent_ledger import ApprovalPendingError, Effect, RunOptions, ToolCall
from agent_ledger.options import StaleOptions
from agent_ledger.review import review
from tests.harness import StoreHarness

CHARGE = ToolCall(workflow_id="order-8", tool="payments.charge", args={"cents": 700})
PARK = RunOptions(on_stale="park", stale=StaleOptions(after_ms=1_000))


async def _parked(harness: StoreHarness) -> Effect:
    ledger = harness.ledger()
    await ledger.begin(CHARGE, run_options=PARK)  # the worker dies mid-handler
    await harness.age(60_000)
    (parked,) = await ledger.park_stale()
    return parked


def _answers(*lines: str) -> tuple[list[str], object]:
    asked: list[str] = []
    given: Iterator[str] = iter(lines)

    async def ask(prompt: str) -> str:
        asked.append(prompt)
        return next(given)

    return asked, ask


async def test_review_shows_why_and_resolves_a_parked_effect(harness: StoreHarness) -> None:
    parked = await _parked(harness)
    ledger = harness.ledger()
    shown: list[str] = []
    asked, ask = _answers("r", "not json", '{"charge_id": "ch_9"}', "provider dashboard")
    tally = await review(ledger, by="ada", ask=ask, say=shown.append)  # type: ignore[arg-type]
    screen = "\n".join(shown)
    assert "ambiguous attempt" in screen and f"attempt  {parked.attempt}" in screen
    assert parked.worker is not None and parked.worker in screen
    assert "[r]esolve" in asked[0]
    assert "not JSON" in screen and "resolved payments.charge" in screen
    assert tally.approved == 1
    settled = await ledger.find_by_idem_key(parked.idem_key)
    assert settled is not None and settled.result == {"charge_id": "ch_9"}
    assert settled.decided_by == "ada" and settled.decision_note == "provider dashboard"
    # A caller now gets the provider's result as a replay: the handler never runs again.
    assert await ledger.run(CHARGE, lambda e: {"charge_id": "ch_again"}, PARK) == {
        "charge_id": "ch_9"
    }


async def test_a_decision_on_a_stale_screen_records_nothing(harness: StoreHarness) -> None:
    """The effect was approved, run again and parked again while the screen showed its
    first attempt: approving from that screen must not approve the new attempt."""
    parked = await _parked(harness)
    ledger = harness.ledger()
    shown: list[str] = []
    _, ask = _answers("a", "")

    real_get = ledger.get_effect

    async def moved_on(effect_id: str) -> Effect | None:
        listed = await real_get(effect_id)
        # Meanwhile: approved by someone else, claimed, the worker died again, parked.
        assert await ledger.approve(parked.idem_key, by="bob")
        await ledger.begin(CHARGE, run_options=PARK)
        await harness.age(60_000)
        assert len(await ledger.park_stale()) == 1
        return listed

    ledger.get_effect = moved_on  # type: ignore[method-assign]
    tally = await review(ledger, by="ada", ask=ask, say=shown.append)  # type: ignore[arg-type]
    assert tally.approved == 0 and tally.taken == 1
    now = await ledger.find_by_idem_key(parked.idem_key)
    assert now is not None and now.parked and now.attempt > parked.attempt


async def test_an_ordinary_approval_is_not_offered_resolve(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    with contextlib.suppress(ApprovalPendingError):  # recorded, waiting for a person
        await ledger.begin(
            CHARGE, run_options=RunOptions(requires_approval=True, wait_for_approval=False)
        )
    assert len(await ledger.pending_approvals()) == 1
    shown: list[str] = []
    asked, ask = _answers("r", "s")
    await review(ledger, by="ada", ask=ask, say=shown.append)  # type: ignore[arg-type]
    assert "[r]esolve" not in asked[0]
    assert "not an answer: 'r'" in "\n".join(shown)
    assert "ambiguous attempt" not in "\n".join(shown)
