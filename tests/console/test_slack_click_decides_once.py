"""A verified Slack click decides through the one decision path: acknowledged at once,
the waiting run() returns, the message is replaced; a stale intent, a tool the
person may not decide, and the loser of two simultaneous clicks change nothing.

Served by uvicorn on local ports against tests/console/fake_slack.py: never the network.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectDeniedError,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.approvals import Channel, DecisionOutcome, intent_hash
from agent_ledger.codes import DecisionCode
from agent_ledger.console import SlackError, post_approval_request
from agent_ledger.deciding import approval_store, effect_intent
from agent_ledger.effects import Effect
from agent_ledger.errors import EffectLedgerValidationError
from tests.console.fake_slack import (
    ALICE,
    BOB,
    BOT_TOKEN,
    CAROL,
    World,
    button,
    click_body,
    sign,
    world,
)
from tests.harness import open_harness

PAY = ToolCall(tool="pay", args={"to": "<!channel> acme", "cents": 12_500}, workflow_id="wf-1")
PARK = RunOptions(requires_approval=True, wait_for_approval=False)
#: Slack shows an error to a person whose click is not answered in 3 s.
SLACK_ACK_LIMIT = 3.0


@pytest.fixture
async def here(tmp_path: Path) -> AsyncIterator[World]:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    async with world(ledger) as w:
        yield w
    await ledger.store.close()


async def _park(w: World) -> Effect:
    with pytest.raises(ApprovalPendingError):
        await w.ledger.run(PAY, lambda e: {"paid": True}, PARK)
    effect = await w.ledger.store.find(w.ledger.idem_key(PAY))
    assert effect is not None
    return effect


async def _post(w: World, effect: Effect) -> dict[str, Any]:
    await post_approval_request(
        w.ledger,
        effect.idem_key,
        channel="C0001",
        bot_token=BOT_TOKEN,
        console_url="https://console.example/approvals",
        api_base_url=f"{w.slack_url}/api/",
    )
    return w.slack.posted[-1]


def _approve(w: World, message: dict[str, Any], user: str) -> bytes:
    value = button(message, "agent_ledger_approve")["value"]
    return click_body(
        action_id="agent_ledger_approve", value=value, user=user, response_url=w.response_url
    )


async def test_the_posted_request_shows_the_args_exactly_and_binds_its_buttons(
    here: World,
) -> None:
    effect = await _park(here)
    message = await _post(here, effect)
    assert message["channel"] == "C0001"
    # Names and arguments are plain text or preformatted: no mention, no link.
    assert "<!channel>" not in message["text"] and "pay" in message["text"]
    blocks = orjson.dumps(message["blocks"]).decode()
    assert "Tool: pay" in blocks and "Workflow: wf-1" in blocks and "Reason: policy" in blocks
    [shown] = [
        element["text"]
        for block in message["blocks"]
        if block["type"] == "rich_text"
        for preformatted in block["elements"]
        for element in preformatted["elements"]
    ]
    pretty = orjson.dumps(orjson.loads(effect.args_canonical), option=orjson.OPT_INDENT_2)
    assert shown == pretty.decode()
    intent = effect_intent(effect, None)
    for action_id, action in (("agent_ledger_approve", "approve"), ("agent_ledger_deny", "deny")):
        value = orjson.loads(button(message, action_id)["value"])
        assert value == {"k": effect.idem_key, "a": action, "i": intent}
    link = button(message, "agent_ledger_open")["url"]
    assert link == f"https://console.example/approvals/effects/{effect.idem_key}"


async def test_posting_refuses_a_wrong_token_and_an_effect_that_does_not_wait(
    here: World,
) -> None:
    effect = await _park(here)
    with pytest.raises(SlackError, match="invalid_auth"):
        await post_approval_request(
            here.ledger,
            effect.idem_key,
            channel="C0001",
            bot_token="xoxb-wrong",
            api_base_url=f"{here.slack_url}/api/",
        )
    with pytest.raises(EffectLedgerValidationError, match="does not exist"):
        await post_approval_request(
            here.ledger,
            "0" * 64,
            channel="C0001",
            bot_token=BOT_TOKEN,
            api_base_url=f"{here.slack_url}/api/",
        )
    assert here.slack.posted == []


async def test_a_valid_click_is_acknowledged_at_once_and_the_waiting_run_returns(
    here: World,
) -> None:
    effect = await _park(here)
    message = await _post(here, effect)
    waiting = asyncio.create_task(here.ledger.run(PAY, lambda e: {"paid": e.args["cents"]}))
    # Slack's response_url holds its reply until the test lets it go: had the
    # acknowledgement waited for that post, it would never come.
    here.slack.hold.clear()
    started = time.monotonic()
    ack = await asyncio.wait_for(here.click(_approve(here, message, ALICE)), SLACK_ACK_LIMIT)
    elapsed = time.monotonic() - started
    assert ack.status_code == 200 and elapsed < SLACK_ACK_LIMIT
    assert await asyncio.wait_for(waiting, 10) == {"paid": 12_500}
    [reply] = await here.slack.wait_for_hooks(1)
    here.slack.hold.set()
    assert reply["replace_original"] is True
    assert reply["text"].startswith("Approved by alice at ")
    assert not any(b["type"] == "actions" and len(b["elements"]) > 1 for b in reply["blocks"])
    done = await here.ledger.store.find(effect.idem_key)
    assert done is not None and done.decided_by == "alice"
    [row] = await approval_store(here.ledger.store).decision_attempts(effect.idem_key)
    assert row.channel is Channel.SLACK and row.principal == "alice"
    assert row.outcome is DecisionOutcome.ACCEPTED and row.intent_hash == effect_intent(
        effect, None
    )


async def test_a_click_for_a_stale_intent_is_refused(here: World) -> None:
    effect = await _park(here)
    # The message showed other arguments than those that would run.
    shown = intent_hash(
        tool="pay",
        workflow_id="wf-1",
        args_canonical='{"cents":1,"to":"acme"}',
        policy_version=None,
        attempt=effect.attempt,
    )
    value = orjson.dumps({"k": effect.idem_key, "a": "approve", "i": shown}).decode()
    body = click_body(
        action_id="agent_ledger_approve", value=value, user=ALICE, response_url=here.response_url
    )
    assert (await here.click(body)).status_code == 200
    [reply] = await here.slack.wait_for_hooks(1)
    assert (
        reply["response_type"] == "ephemeral"
        and "differs from what you were shown" in reply["text"]
    )
    still = await here.ledger.store.find(effect.idem_key)
    assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
    [row] = await approval_store(here.ledger.store).decision_attempts(effect.idem_key)
    assert row.reason_code is DecisionCode.INTENT_MISMATCH and row.intent_hash == shown


async def test_a_person_not_allowed_for_the_tool_is_refused_and_audited(here: World) -> None:
    effect = await _park(here)
    message = await _post(here, effect)
    assert (await here.click(_approve(here, message, CAROL))).status_code == 200
    [reply] = await here.slack.wait_for_hooks(1)
    assert reply["response_type"] == "ephemeral" and "carol may not decide pay" in reply["text"]
    still = await here.ledger.store.find(effect.idem_key)
    assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
    [row] = await approval_store(here.ledger.store).decision_attempts(effect.idem_key)
    assert row.principal == "carol" and row.reason_code is DecisionCode.NOT_ALLOWED


async def test_an_async_rule_that_says_no_refuses_a_click(tmp_path: Path) -> None:
    """An ``async def`` authorize rule is awaited: its False refuses (a coroutine is not a yes)."""

    async def nobody(principal: str, tool: str) -> bool:
        return False

    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    try:
        async with world(ledger, authorize=nobody) as there:
            effect = await _park(there)
            message = await _post(there, effect)
            assert (await there.click(_approve(there, message, ALICE))).status_code == 200
            [reply] = await there.slack.wait_for_hooks(1)
            assert "alice may not decide pay" in reply["text"]
            still = await there.ledger.store.find(effect.idem_key)
            assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
    finally:
        await ledger.store.close()


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
async def anywhere(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    """The console and the fake Slack over each store (PostgreSQL, MariaDB: the real servers)."""
    async with open_harness(request.param) as harness, world(harness.ledger()) as w:
        yield w


async def test_two_clicks_at_once_one_decides_and_the_other_is_told_who_did(
    anywhere: World,
) -> None:
    here = anywhere
    effect = await _park(here)
    message = await _post(here, effect)
    acks = await asyncio.gather(
        here.click(_approve(here, message, ALICE)), here.click(_approve(here, message, BOB))
    )
    assert [a.status_code for a in acks] == [200, 200]
    replies = await here.slack.wait_for_hooks(2)
    done = await here.ledger.store.find(effect.idem_key)
    assert done is not None and done.status is EffectStatus.READY
    winner = done.decided_by
    assert winner in ("alice", "bob")
    texts = sorted(r["text"] for r in replies)
    assert texts[0].startswith(f"Approved by {winner} at ")
    assert texts[1].startswith(f"already decided by {winner} at ")
    assert all(r["replace_original"] is True for r in replies)
    rows = await approval_store(here.ledger.store).decision_attempts(effect.idem_key)
    assert sorted(r.reason_code for r in rows) == [
        DecisionCode.ALREADY_DECIDED,
        DecisionCode.DECIDED,
    ]
    assert [r.outcome for r in rows].count(DecisionOutcome.ACCEPTED) == 1


async def test_a_deny_click_denies_and_the_waiting_run_is_told(here: World) -> None:
    effect = await _park(here)
    message = await _post(here, effect)
    waiting = asyncio.create_task(here.ledger.run(PAY, lambda e: {"paid": True}))
    value = button(message, "agent_ledger_deny")["value"]
    body = click_body(
        action_id="agent_ledger_deny", value=value, user=BOB, response_url=here.response_url
    )
    assert (await here.click(body, sign(body))).status_code == 200
    with pytest.raises(EffectDeniedError):
        await asyncio.wait_for(waiting, 10)
    [reply] = await here.slack.wait_for_hooks(1)
    assert reply["text"].startswith("Denied by bob at ")
    done = await here.ledger.store.find(effect.idem_key)
    assert done is not None and done.status is EffectStatus.DENIED and done.decided_by == "bob"


async def test_arguments_too_long_for_a_message_are_not_shown_and_get_no_buttons(
    here: World,
) -> None:
    big = ToolCall(tool="pay", args={"memo": "x" * 30_000, "cents": 1}, workflow_id="wf-1")
    with pytest.raises(ApprovalPendingError):
        await here.ledger.run(big, lambda e: {"paid": True}, PARK)
    effect = await here.ledger.store.find(here.ledger.idem_key(big))
    assert effect is not None
    message = await _post(here, effect)
    ids = [
        element.get("action_id")
        for block in message["blocks"]
        if block["type"] == "actions"
        for element in block["elements"]
    ]
    assert ids == ["agent_ledger_open"]
    assert not any(block["type"] == "rich_text" for block in message["blocks"])
    assert "too long to show here" in orjson.dumps(message["blocks"]).decode()


async def test_the_outcome_is_posted_only_to_an_allowed_response_url_origin(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    caplog.set_level(logging.WARNING, logger="agent_ledger")
    async with world(ledger, response_url_origins=["https://hooks.slack.com"]) as here:
        effect = await _park(here)
        message = await _post(here, effect)
        assert (await here.click(_approve(here, message, ALICE))).status_code == 200
        async with asyncio.timeout(10):
            while not any("not an allowed origin" in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.02)
        assert here.slack.hooks == []
        # The decision stands (the click was Slack's); only the post was withheld.
        done = await ledger.store.find(effect.idem_key)
        assert done is not None and done.decided_by == "alice"
    await ledger.store.close()


async def test_with_separation_of_duty_the_asker_cannot_approve_from_slack(
    tmp_path: Path,
) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    async with world(ledger, separation_of_duty=True) as here:
        effect = await _park(here)
        await approval_store(ledger.store).renew_request(
            effect.idem_key, requested_by="alice", policy_version=None, deadline_ms=None
        )
        message = await _post(here, effect)
        assert (await here.click(_approve(here, message, ALICE))).status_code == 200
        [reply] = await here.slack.wait_for_hooks(1)
        assert reply["response_type"] == "ephemeral" and "separation of duty" in reply["text"]
        still = await ledger.store.find(effect.idem_key)
        assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
        [row] = await approval_store(ledger.store).decision_attempts(effect.idem_key)
        assert row.principal == "alice" and row.reason_code is DecisionCode.SELF_DECISION
    await ledger.store.close()
