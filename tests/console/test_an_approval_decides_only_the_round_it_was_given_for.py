"""An approval is for one round: approved, run, its worker dead after the handler
started, the effect waits for a person again (an ambiguous attempt). What the
person saw the first time (a console form, a signed link, any shown intent)
must not approve that second round, or the handler runs twice.

The intent hash names the attempt; ``decide`` refuses an earlier round's hash
as ``earlier_attempt`` and changes nothing. Run on every store: the refusal and
its audit row go through each store's approval steps.
"""

from __future__ import annotations

import re
from datetime import timedelta

import httpx
import pytest

from agent_ledger import ApprovalPendingError, EffectLedger, EffectStatus, RunOptions, ToolCall
from agent_ledger.approvals import Channel, DecisionAction, DecisionOutcome
from agent_ledger.codes import DecisionCode, ErrorCode
from agent_ledger.console import StaticUsers, ToolPatterns, create_app, hash_password, sign_link
from agent_ledger.deciding import approval_store, decide, effect_intent
from agent_ledger.effects import Effect
from agent_ledger.options import StaleOptions
from tests.harness import StoreHarness

pytestmark = pytest.mark.every_store

LEASE_MS = 1000
POLICY = RunOptions(
    requires_approval=True,
    wait_for_approval=False,
    on_stale="park",
    stale=StaleOptions(after_ms=LEASE_MS),
)
RUN = RunOptions(on_stale="park", stale=StaleOptions(after_ms=LEASE_MS), wait_for_approval=False)
PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 12_500}, workflow_id="wf-round")
SECRET = b"r" * 32
ORIGIN = "http://console.test"
USERS = {"alice": hash_password("alice-pw")}
ALICE = {"Authorization": "Basic YWxpY2U6YWxpY2UtcHc="}  # alice:alice-pw


async def _first_round(ledger: EffectLedger) -> Effect:
    with pytest.raises(ApprovalPendingError):
        await ledger.run(PAY, lambda e: "paid", POLICY)
    effect = await ledger.store.find(ledger.idem_key(PAY))
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    return effect


async def _second_round(harness: StoreHarness, ledger: EffectLedger) -> Effect:
    """The approved effect is claimed, its handler starts, its worker dies: parked."""
    begun = await ledger.begin(PAY, run_options=RUN)
    assert not begun.cached
    await harness.age(3 * LEASE_MS)
    (parked,) = await ledger.park_stale()
    assert parked.status is EffectStatus.REQUIRES_APPROVAL and parked.parked
    assert parked.error is not None and parked.error.code == ErrorCode.AMBIGUOUS_ATTEMPT
    return parked


async def test_an_intent_shown_for_an_earlier_attempt_decides_nothing(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    store = harness.store
    first = await _first_round(ledger)
    shown_first = effect_intent(first, None)
    approved = await decide(
        store,
        first.idem_key,
        action=DecisionAction.APPROVE,
        principal="alice",
        channel=Channel.CONSOLE,
        shown_intent=shown_first,
    )
    assert approved.accepted
    parked = await _second_round(harness, ledger)
    assert parked.attempt > first.attempt
    assert effect_intent(parked, None) != shown_first

    stale = await decide(
        store,
        parked.idem_key,
        action=DecisionAction.APPROVE,
        principal="alice",
        channel=Channel.CONSOLE,
        shown_intent=shown_first,
    )
    assert not stale.accepted and stale.reason is DecisionCode.EARLIER_ATTEMPT
    assert "earlier attempt" in stale.message
    after = await store.find(parked.idem_key)
    assert after is not None
    assert (after.status, after.attempt, after.executions) == (
        EffectStatus.REQUIRES_APPROVAL,
        parked.attempt,
        parked.executions,
    )
    last = (await approval_store(store).decision_attempts(parked.idem_key))[-1]
    assert (last.outcome, last.reason_code, last.intent_hash) == (
        DecisionOutcome.REFUSED,
        DecisionCode.EARLIER_ATTEMPT,
        shown_first,
    )
    # What the second round shows decides it.
    fresh = await decide(
        store,
        parked.idem_key,
        action=DecisionAction.DENY,
        principal="alice",
        channel=Channel.CONSOLE,
        shown_intent=effect_intent(parked, None),
    )
    assert fresh.accepted and fresh.effect is not None
    assert fresh.effect.status is EffectStatus.DENIED


def _client(ledger: EffectLedger) -> httpx.AsyncClient:
    app = create_app(
        ledger,
        authenticate=StaticUsers(USERS),
        authorize=ToolPatterns({"alice": ["pay"]}),
        secret=SECRET,
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)


def _field(html: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([0-9a-f]+)"', html)
    assert found, html
    return found.group(1)


async def test_a_console_form_or_a_link_from_an_earlier_round_is_refused(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    first = await _first_round(ledger)
    async with _client(ledger) as client:
        page = await client.get(f"/effects/{first.idem_key}", headers=ALICE)
        form = {"csrf": _field(page.text, "csrf"), "intent": _field(page.text, "intent")}
        # The email sent in the first round, and a second tab left open on the form.
        link = sign_link(
            SECRET,
            idem_key=first.idem_key,
            intent_hash=form["intent"],
            action=DecisionAction.APPROVE,
            principal="alice",
            ttl=timedelta(days=1),
        )
        posted = await client.post(
            f"/effects/{first.idem_key}/decide",
            headers={**ALICE, "Origin": ORIGIN},
            data={**form, "action": "approve"},
        )
        assert posted.status_code == 303
        parked = await _second_round(harness, ledger)

        stale_form = await client.post(
            f"/effects/{first.idem_key}/decide",
            headers={**ALICE, "Origin": ORIGIN},
            data={**form, "action": "approve"},
        )
        assert stale_form.status_code == 409
        assert "earlier attempt" in stale_form.text

        shown = await client.get(f"/links/{link}")
        assert shown.status_code == 410 and "earlier attempt" in shown.text
        # The confirmation page was never served, but a POST must not decide either.
        csrf_for_link = re.search(r'name="csrf" value="([0-9a-f]+)"', shown.text)
        assert csrf_for_link is None
        page_two = await client.get(f"/effects/{first.idem_key}", headers=ALICE)
        assert _field(page_two.text, "intent") != form["intent"]

    after = await ledger.store.find(first.idem_key)
    assert after is not None
    assert (after.status, after.attempt, after.executions) == (
        EffectStatus.REQUIRES_APPROVAL,
        parked.attempt,
        parked.executions,
    )
    refused = [
        a
        for a in await approval_store(ledger.store).decision_attempts(first.idem_key)
        if a.outcome is DecisionOutcome.REFUSED
    ]
    assert [(a.channel, a.reason_code) for a in refused] == [
        (Channel.CONSOLE, DecisionCode.EARLIER_ATTEMPT)
    ]


async def test_a_link_post_from_an_earlier_round_is_gone_and_keeps_its_nonce(
    harness: StoreHarness,
) -> None:
    """The link's POST (its confirmation page opened in the first round) is refused
    with 410 and audited; its nonce is not consumed by a refusal."""
    ledger = harness.ledger()
    first = await _first_round(ledger)
    intent = effect_intent(first, None)
    link = sign_link(
        SECRET,
        idem_key=first.idem_key,
        intent_hash=intent,
        action=DecisionAction.APPROVE,
        principal="alice",
        ttl=timedelta(days=1),
    )
    async with _client(ledger) as client:
        confirm = await client.get(f"/links/{link}")
        assert confirm.status_code == 200
        csrf = _field(confirm.text, "csrf")
        approved = await decide(
            ledger.store,
            first.idem_key,
            action=DecisionAction.APPROVE,
            principal="bob",
            channel=Channel.CODE,
            shown_intent=intent,
        )
        assert approved.accepted
        parked = await _second_round(harness, ledger)
        posted = await client.post(
            f"/links/{link}", headers={"Origin": ORIGIN}, data={"csrf": csrf}
        )
    assert posted.status_code == 410 and "earlier attempt" in posted.text
    after = await ledger.store.find(first.idem_key)
    assert after is not None and after.status is EffectStatus.REQUIRES_APPROVAL
    assert after.executions == parked.executions
    last = (await approval_store(ledger.store).decision_attempts(first.idem_key))[-1]
    assert (last.channel, last.outcome, last.reason_code) == (
        Channel.LINK,
        DecisionOutcome.REFUSED,
        DecisionCode.EARLIER_ATTEMPT,
    )
