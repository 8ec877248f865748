"""Slack interactivity refuses what Slack did not sign, or signed too long ago, or
already sent, or sent for a person it cannot name; none of it changes an effect.

Served by uvicorn on local ports against tests/console/fake_slack.py: never the network.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.approvals import Channel, DecisionAction, DecisionOutcome
from agent_ledger.codes import DecisionCode
from agent_ledger.console import BadSlackRequest, post_approval_request, verify_slack_request
from agent_ledger.deciding import approval_store
from agent_ledger.effects import Effect
from tests.console.fake_slack import (
    ALICE,
    BOT_TOKEN,
    SIGNING_SECRET,
    STRANGER,
    World,
    button,
    click_body,
    sign,
    world,
)

PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 12_500}, workflow_id="wf-1")
PARK = RunOptions(requires_approval=True, wait_for_approval=False)

# Slack's published example (api.slack.com, "Verifying requests from Slack").
DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow"
    b"&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner"
    b"&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2F"
    b"commands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id="
    b"398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
DOC_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
DOC_TIMESTAMP = 1531420618


@pytest.fixture
async def here(tmp_path: Path) -> AsyncIterator[World]:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    async with world(ledger) as w:
        yield w
    await ledger.store.close()


async def _posted(w: World) -> tuple[Effect, str]:
    """A parked payment, posted to the fake Slack; its Approve button's value."""
    with pytest.raises(ApprovalPendingError):
        await w.ledger.run(PAY, lambda e: {"paid": True}, PARK)
    effect = await w.ledger.store.find(w.ledger.idem_key(PAY))
    assert effect is not None
    await post_approval_request(
        w.ledger,
        effect.idem_key,
        channel="C0001",
        bot_token=BOT_TOKEN,
        api_base_url=f"{w.slack_url}/api/",
    )
    return effect, button(w.slack.posted[-1], "agent_ledger_approve")["value"]


async def _unchanged(w: World, effect: Effect, *, attempts: int = 0) -> None:
    still = await w.ledger.store.find(effect.idem_key)
    assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
    assert still.decided_by is None
    rows = await approval_store(w.ledger.store).decision_attempts(effect.idem_key)
    assert len(rows) == attempts


def test_slacks_published_example_verifies_and_nothing_else_does() -> None:
    verify_slack_request(
        SIGNING_SECRET,
        timestamp=str(DOC_TIMESTAMP),
        body=DOC_BODY,
        signature=DOC_SIGNATURE,
        now=DOC_TIMESTAMP + 10,
    )
    refused = [
        (SIGNING_SECRET[:-1] + "6", str(DOC_TIMESTAMP), DOC_BODY, DOC_SIGNATURE),
        (SIGNING_SECRET, str(DOC_TIMESTAMP), DOC_BODY + b"&x=1", DOC_SIGNATURE),
        (SIGNING_SECRET, str(DOC_TIMESTAMP + 1), DOC_BODY, DOC_SIGNATURE),
        (SIGNING_SECRET, str(DOC_TIMESTAMP), DOC_BODY, DOC_SIGNATURE[:-1] + "4"),
        (SIGNING_SECRET, str(DOC_TIMESTAMP), DOC_BODY, DOC_SIGNATURE.upper()),
        (SIGNING_SECRET, str(DOC_TIMESTAMP), DOC_BODY, "v0=é"),
        (SIGNING_SECRET, "", DOC_BODY, DOC_SIGNATURE),
        (SIGNING_SECRET, "-1531420618", DOC_BODY, DOC_SIGNATURE),
        (SIGNING_SECRET, str(DOC_TIMESTAMP), DOC_BODY, None),
    ]
    for secret, timestamp, body, signature in refused:
        with pytest.raises(BadSlackRequest) as bad:
            verify_slack_request(
                secret, timestamp=timestamp, body=body, signature=signature, now=DOC_TIMESTAMP
            )
        assert bad.value.status == 401


def test_a_timestamp_more_than_five_minutes_off_either_way_is_refused() -> None:
    def check(now: float) -> None:
        verify_slack_request(
            SIGNING_SECRET,
            timestamp=str(DOC_TIMESTAMP),
            body=DOC_BODY,
            signature=DOC_SIGNATURE,
            now=now,
        )

    check(DOC_TIMESTAMP + 300)
    check(DOC_TIMESTAMP - 300)
    for now in (DOC_TIMESTAMP + 301, DOC_TIMESTAMP - 301, DOC_TIMESTAMP + 86_400):
        with pytest.raises(BadSlackRequest, match="five minutes"):
            check(now)


async def test_a_bad_signature_is_refused_and_changes_nothing(here: World) -> None:
    effect, value = await _posted(here)
    body = click_body(
        action_id="agent_ledger_approve", value=value, user=ALICE, response_url=here.response_url
    )
    wrong_secret = await here.click(body, sign(body, secret="not-the-signing-secret"))
    tampered = body.replace(ALICE.encode(), b"U0MALLORY")
    altered_body = await here.click(tampered, sign(body))
    unsigned = await here.click(body, {"Content-Type": "application/x-www-form-urlencoded"})
    assert [r.status_code for r in (wrong_secret, altered_body, unsigned)] == [401, 401, 401]
    assert "signature" in wrong_secret.text
    await _unchanged(here, effect)
    assert here.slack.hooks == []


async def test_an_old_timestamp_is_refused_and_changes_nothing(here: World) -> None:
    effect, value = await _posted(here)
    body = click_body(
        action_id="agent_ledger_approve", value=value, user=ALICE, response_url=here.response_url
    )
    now = int(time.time())
    for timestamp in (now - 301, now - 3600, now + 3600):
        refused = await here.click(body, sign(body, timestamp))
        assert refused.status_code == 401, timestamp
        assert "five minutes" in refused.text
    await _unchanged(here, effect)
    assert here.slack.hooks == []


async def test_a_replayed_body_with_a_new_timestamp_or_again_as_sent_is_refused(
    here: World,
) -> None:
    effect, value = await _posted(here)
    body = click_body(
        action_id="agent_ledger_approve", value=value, user=STRANGER, response_url=here.response_url
    )
    # A request captured five minutes ago: its body and signature with today's
    # timestamp. The timestamp is signed, so the signature no longer holds.
    old = sign(body, int(time.time()) - 400)
    replayed = await here.click(body, {**old, "X-Slack-Request-Timestamp": str(int(time.time()))})
    assert replayed.status_code == 401
    await _unchanged(here, effect)
    # The genuine request taken once; the very same request again is refused.
    headers = sign(body)
    assert (await here.click(body, headers)).status_code == 200
    assert (await here.click(body, headers)).status_code == 401
    await here.slack.wait_for_hooks(1)
    await _unchanged(here, effect, attempts=1)


async def test_an_oversized_body_is_refused_before_it_is_read(here: World) -> None:
    effect, _value = await _posted(here)
    body = b"payload=" + b"x" * (256 * 1024)
    refused = await here.click(body, sign(body))
    assert refused.status_code == 413
    await _unchanged(here, effect)


async def test_an_unmapped_user_gets_an_ephemeral_refusal_and_is_audited(here: World) -> None:
    effect, value = await _posted(here)
    body = click_body(
        action_id="agent_ledger_approve", value=value, user=STRANGER, response_url=here.response_url
    )
    ack = await here.click(body)
    assert ack.status_code == 200
    [reply] = await here.slack.wait_for_hooks(1)
    assert reply["response_type"] == "ephemeral" and reply["replace_original"] is False
    assert "not mapped" in reply["text"]
    await _unchanged(here, effect, attempts=1)
    [row] = await approval_store(here.ledger.store).decision_attempts(effect.idem_key)
    assert row.principal == f"slack:T0001:{STRANGER}"
    assert row.channel is Channel.SLACK and row.action is DecisionAction.APPROVE
    assert row.outcome is DecisionOutcome.REFUSED
    assert row.reason_code is DecisionCode.UNMAPPED_USER
    assert row.intent_hash == orjson.loads(value)["i"]


async def test_a_mapped_user_from_another_workspace_is_unmapped(tmp_path: Path) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    async with world(ledger, team_id="T0HOME") as here:
        effect, value = await _posted(here)
        body = click_body(
            action_id="agent_ledger_approve",
            value=value,
            user=ALICE,
            response_url=here.response_url,
            team="T0ELSEWHERE",
        )
        assert (await here.click(body)).status_code == 200
        [reply] = await here.slack.wait_for_hooks(1)
        assert "not mapped" in reply["text"]
        await _unchanged(here, effect, attempts=1)
    await ledger.store.close()


async def test_a_malformed_or_foreign_interaction_changes_nothing(here: World) -> None:
    effect, value = await _posted(here)
    data = orjson.loads(value)
    cases = {
        # The Deny button's action_id carrying an approve value: one is not the other.
        "mismatched": (
            click_body(
                action_id="agent_ledger_deny",
                value=value,
                user=ALICE,
                response_url=here.response_url,
            ),
            400,
        ),
        "no intent": (
            click_body(
                action_id="agent_ledger_approve",
                value=orjson.dumps({**data, "i": "nope"}).decode(),
                user=ALICE,
                response_url=here.response_url,
            ),
            400,
        ),
        "no payload": (b"token=x", 400),
        # The receipt link button and other apps' actions are acknowledged and ignored.
        "link button": (
            click_body(
                action_id="agent_ledger_open",
                value="",
                user=ALICE,
                response_url=here.response_url,
            ),
            200,
        ),
    }
    for name, (body, status) in cases.items():
        assert (await here.click(body)).status_code == status, name
    await _unchanged(here, effect)
    assert here.slack.hooks == []
