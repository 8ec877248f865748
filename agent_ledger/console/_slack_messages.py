"""Slack messages about an approval: their blocks, and posting them with a bot token.

The HTTP client is httpx (the ``console`` extra), imported when a message is
posted: ``import agent_ledger.console`` does not need it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import orjson

from agent_ledger.approvals import ApprovalRequest, DecisionAction, is_intent_hash
from agent_ledger.deciding import approval_store, effect_intent
from agent_ledger.effects import Effect
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import Store

__all__ = [
    "ACTION_APPROVE",
    "ACTION_DENY",
    "SLACK_API",
    "SlackError",
    "SlackMessage",
    "approval_blocks",
    "post_approval_request",
]

logger = logging.getLogger("agent_ledger")

#: Slack's Web API; a test (or GovSlack) passes its own ``api_base_url``.
SLACK_API: Final = "https://slack.com/api/"
#: The ``action_id`` of the message's buttons.
ACTION_APPROVE: Final = "agent_ledger_approve"
ACTION_DENY: Final = "agent_ledger_deny"
ACTION_OPEN: Final = "agent_ledger_open"
_BUTTONS: Final = {ACTION_APPROVE: DecisionAction.APPROVE, ACTION_DENY: DecisionAction.DENY}
#: Slack refuses a text object over 3,000 characters and a button value over 2,000.
_CHUNK: Final = 2900
_VALUE_LIMIT: Final = 2000
#: Arguments longer than this many preformatted blocks are not shown in Slack, and
#: the message offers no buttons: a person decides only what they could read.
_MAX_ARG_BLOCKS: Final = 10


class SlackError(Exception):
    """Slack's Web API refused a call (``error``: its error string or the HTTP status)."""

    def __init__(self, method: str, error: str) -> None:
        super().__init__(f"Slack {method} failed: {error}")
        self.method = method
        self.error = error


@dataclass(frozen=True, slots=True)
class SlackMessage:
    """A posted message: its channel id and timestamp (Slack's message id)."""

    channel: str
    ts: str


def button_value(idem_key: str, action: DecisionAction, intent: str) -> str:
    """What a button carries back: the effect key, the action and the intent hash shown."""
    value = orjson.dumps({"k": idem_key, "a": action.value, "i": intent}).decode()
    if len(value) > _VALUE_LIMIT:
        raise EffectLedgerValidationError(
            f"the effect key is too long for a Slack button ({len(value)} > {_VALUE_LIMIT})",
            field="idem_key",
        )
    return value


def parse_button(action_id: str, value: str) -> tuple[str, DecisionAction, str]:
    """(effect key, action, intent hash) from a clicked button; ValueError if malformed.

    The action must agree with the button's ``action_id``: one does not stand in for
    the other.
    """
    data = orjson.loads(value)
    if not isinstance(data, dict):
        raise ValueError("the button's value is not an object")
    key, action, intent = data.get("k"), data.get("a"), data.get("i")
    if not isinstance(key, str) or not key or not is_intent_hash(intent):
        raise ValueError("the button's value has no effect key or intent hash")
    expected = _BUTTONS.get(action_id)
    if expected is None or action != expected.value:
        raise ValueError("the button's action does not match its action_id")
    assert isinstance(intent, str)
    return key, expected, intent


def receipt_url(console_url: str, idem_key: str) -> str:
    return f"{console_url.rstrip('/')}/effects/{quote(idem_key, safe='')}"


def pretty_json(canonical: str) -> str:
    """Stored canonical JSON indented for a person (the text itself if it is not JSON)."""
    try:
        return orjson.dumps(orjson.loads(canonical), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return canonical


def _plain(text: str) -> dict[str, Any]:
    # plain_text: Slack parses no markup in it, so no argument or name can
    # become a mention, a link or formatting.
    return {"type": "plain_text", "text": text[:_CHUNK] or " ", "emoji": False}


def escape_mrkdwn(text: str) -> str:
    """Text for a mrkdwn field: Slack's three control characters escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _asked_by(effect: Effect, request: ApprovalRequest | None) -> str:
    if request is not None and request.requested_by:
        return request.requested_by
    return effect.worker or "-"


def approval_blocks(
    effect: Effect,
    request: ApprovalRequest | None,
    *,
    console_url: str | None = None,
    outcome: str | None = None,
) -> list[dict[str, Any]]:
    """The Block Kit blocks of an approval request: tool, workflow, reason, asker,
    the canonical arguments exactly as they will run (pretty-printed), a link to
    the console's receipt, and Approve / Deny buttons bound to the effect's
    intent hash. With ``outcome`` (the message after a decision) the buttons
    give way to that line."""
    reason = "ambiguous attempt" if effect.parked else "policy"
    title = f"Approval needed: {effect.tool}" if outcome is None else effect.tool
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": _plain(title[:150])},
        {
            "type": "section",
            "fields": [
                _plain(f"Tool: {effect.tool}"),
                _plain(f"Workflow: {effect.workflow_id}"),
                _plain(f"Reason: {reason}"),
                _plain(f"Asked by: {_asked_by(effect, request)}"),
            ],
        },
    ]
    pretty = pretty_json(effect.args_canonical)
    chunks = [pretty[i : i + _CHUNK] for i in range(0, len(pretty), _CHUNK)] or [""]
    shown = len(chunks) <= _MAX_ARG_BLOCKS
    if shown:
        blocks.extend(
            {
                "type": "rich_text",
                "elements": [
                    {"type": "rich_text_preformatted", "elements": [{"type": "text", "text": c}]}
                ],
            }
            for c in chunks
        )
    else:
        blocks.append(
            {
                "type": "section",
                "text": _plain(
                    f"The arguments ({len(pretty)} characters) are too long to show here: "
                    "decide in the console."
                ),
            }
        )
    elements: list[dict[str, Any]] = []
    if outcome is None and shown and effect.status is EffectStatus.REQUIRES_APPROVAL:
        intent = effect_intent(effect, request)
        elements += [
            {
                "type": "button",
                "action_id": ACTION_APPROVE,
                "style": "primary",
                "text": _plain("Approve"),
                "value": button_value(effect.idem_key, DecisionAction.APPROVE, intent),
                "confirm": {
                    "title": _plain("Approve?"),
                    "text": _plain(f"Run {effect.tool} with the arguments shown?"[:300]),
                    "confirm": _plain("Approve"),
                    "deny": _plain("Cancel"),
                },
            },
            {
                "type": "button",
                "action_id": ACTION_DENY,
                "style": "danger",
                "text": _plain("Deny"),
                "value": button_value(effect.idem_key, DecisionAction.DENY, intent),
            },
        ]
    if console_url:
        elements.append(
            {
                "type": "button",
                "action_id": ACTION_OPEN,
                "text": _plain("Open the receipt"),
                "url": receipt_url(console_url, effect.idem_key),
            }
        )
    if elements:
        blocks.append({"type": "actions", "elements": elements})
    if outcome is not None:
        blocks.append({"type": "context", "elements": [_plain(outcome)]})
    return blocks


async def slack_call(
    api_base_url: str, method: str, token: str, body: Mapping[str, Any], http_timeout: float
) -> dict[str, Any]:
    """POST ``body`` to Slack's Web API ``method``; its reply, or SlackError."""
    import httpx

    url = f"{api_base_url.rstrip('/')}/{method}"
    async with httpx.AsyncClient(timeout=http_timeout) as client:
        reply = await client.post(
            url,
            content=orjson.dumps(body),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json; charset=utf-8",
            },
        )
    if reply.status_code != 200:
        raise SlackError(method, f"HTTP {reply.status_code}")
    try:
        data = orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        raise SlackError(method, "the reply is not JSON") from None
    if not isinstance(data, dict) or data.get("ok") is not True:
        error = data.get("error") if isinstance(data, dict) else None
        raise SlackError(method, str(error or "ok is not true"))
    return data


async def post_approval_request(
    ledger: object,
    idem_key: str,
    *,
    channel: str,
    bot_token: str,
    console_url: str | None = None,
    api_base_url: str = SLACK_API,
    http_timeout: float = 10.0,
) -> SlackMessage:
    """Post the approval request for ``idem_key`` to ``channel`` (``chat.postMessage``
    with the bot token, which needs the ``chat:write`` scope) with Approve / Deny
    buttons; the clicks come back to the console's ``/slack/interactivity``.

    ``ledger``: an ``EffectLedger`` or its store. ``console_url``: the console's
    public base URL (with its mount path), for the receipt link. ``http_timeout``:
    seconds for Slack's reply. Raises
    ``EffectLedgerValidationError`` for an effect that does not wait for a
    person, ``SlackError`` if Slack refuses the message.
    """
    store = getattr(ledger, "store", ledger)
    if not isinstance(store, Store):
        raise TypeError(f"post_approval_request() takes an EffectLedger or a store, not {ledger!r}")
    effect = await store.find(idem_key)
    if effect is None or effect.status is not EffectStatus.REQUIRES_APPROVAL:
        state = "does not exist" if effect is None else f"is {effect.status.value}"
        raise EffectLedgerValidationError(
            f"effect {idem_key} {state}: only an effect waiting for a person is posted",
            field="idem_key",
        )
    request = await approval_store(store).approval_request(idem_key)
    body = {
        "channel": channel,
        # The fallback text is mrkdwn: escaped, so no name becomes a mention or a link.
        "text": escape_mrkdwn(f"Approval needed: {effect.tool} in workflow {effect.workflow_id}"),
        "blocks": approval_blocks(effect, request, console_url=console_url),
        "unfurl_links": False,
    }
    reply = await slack_call(api_base_url, "chat.postMessage", bot_token, body, http_timeout)
    return SlackMessage(str(reply.get("channel", channel)), str(reply.get("ts", "")))
