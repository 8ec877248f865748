"""Slack interactivity: a click on an approval message's Approve / Deny button.

Slack signs each request: ``X-Slack-Signature`` is ``v0=`` and the hex
HMAC-SHA256, under the app's signing secret, of ``v0:<timestamp>:<raw body>``
(``X-Slack-Request-Timestamp``). A request whose signature does not verify
(compared in constant time), whose timestamp is more than five minutes from
this clock, whose body is over the bound, or that this process has already
seen, is refused (401, or 413 for the size) before anything is read from it;
like a forged link, it carries no principal anyone vouched for, so it is
logged, not audited.

A verified click is acknowledged at once (Slack waits 3 s) and decided after
the reply: the Slack user is mapped to a principal (unmapped: an ephemeral
refusal, audited as ``unmapped_user``), the console's authorization rule
applies, and ``decide()`` makes the decision with channel ``slack``, bound to
the intent hash the message showed. The outcome is posted to the click's
``response_url``: the original message replaced ("Approved by X at T",
"already decided by X at T"), or an ephemeral refusal for the clicker.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from agent_ledger.approvals import Channel, DecisionAction, NewDecisionAttempt
from agent_ledger.codes import DecisionCode
from agent_ledger.console._identity import Authorize, may_decide
from agent_ledger.console._slack_messages import (
    ACTION_APPROVE,
    ACTION_DENY,
    approval_blocks,
    escape_mrkdwn,
    parse_button,
)
from agent_ledger.deciding import approval_store, decide, refuse
from agent_ledger.effects import Effect
from agent_ledger.stores.base import Store

__all__ = ["BadSlackRequest", "SlackInteractivity", "SlackSettings", "verify_slack_request"]

logger = logging.getLogger("agent_ledger")

#: Slack's advice: refuse a request whose timestamp is over five minutes off.
TOLERANCE_SECONDS: Final = 300
#: The most signatures remembered to refuse an exact replay (each for the tolerance).
_SEEN_LIMIT: Final = 10_000

#: Slack user id -> principal (None: not mapped); may be async.
SlackUsers = Mapping[str, str] | Callable[[str], "str | Awaitable[str | None] | None"]


class BadSlackRequest(Exception):
    """A request that is not a genuine, fresh Slack request (``status``: 401 or 413)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


def verify_slack_request(
    signing_secret: str | bytes,
    *,
    timestamp: str | None,
    body: bytes,
    signature: str | None,
    now: float | None = None,
) -> None:
    """Check Slack's v0 signature of ``body``; ``BadSlackRequest`` if it does not hold.

    ``timestamp`` and ``signature`` are the ``X-Slack-Request-Timestamp`` and
    ``X-Slack-Signature`` headers; ``now`` (default: this clock, Unix seconds)
    judges the timestamp, which may be at most five minutes off either way.
    """
    if not timestamp or not signature:
        raise BadSlackRequest("not signed by Slack: a signature header is missing")
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        raise BadSlackRequest("not signed by Slack: the timestamp is not a number")
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > TOLERANCE_SECONDS:
        raise BadSlackRequest("the request's timestamp is more than five minutes off")
    secret = signing_secret.encode() if isinstance(signing_secret, str) else signing_secret
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = b"v0=" + hmac.new(secret, base, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(expected, signature.encode("utf-8", "replace")):
        raise BadSlackRequest("not signed by Slack: the signature does not verify")


@dataclass(frozen=True)
class SlackSettings:
    """What ``create_app(..., slack=SlackSettings(...))`` needs to take Slack clicks.

    ``signing_secret``: the Slack app's (Basic Information page). ``users``:
    Slack user id -> principal, a mapping or a callable (sync or async; None:
    not mapped). ``team_id``: if set, clicks from any other workspace are
    treated as unmapped. ``console_url``: the console's public base URL, for
    the receipt link in replaced messages. ``response_url_origins``: where the
    outcome may be posted (Slack's ``response_url`` is on hooks.slack.com).
    ``max_body_bytes``: a larger request is refused (413).
    """

    signing_secret: str | bytes
    users: SlackUsers
    team_id: str | None = None
    console_url: str | None = None
    response_url_origins: Iterable[str] = ("https://hooks.slack.com",)
    max_body_bytes: int = 256 * 1024
    #: Seconds allowed for the post to the response_url.
    timeout: float = 10.0
    _origins: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.signing_secret:
            raise ValueError("signing_secret must be the Slack app's signing secret")
        if not (isinstance(self.users, Mapping) or callable(self.users)):
            raise TypeError("users must be a mapping or a callable: Slack user id -> principal")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        origins = frozenset(o.rstrip("/") for o in self.response_url_origins)
        object.__setattr__(self, "_origins", origins)

    def may_post_to(self, url: str) -> bool:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}" in self._origins


@dataclass(frozen=True, slots=True)
class _Click:
    user_id: str
    team_id: str | None
    idem_key: str
    action: DecisionAction
    intent: str
    response_url: str | None


def _click(body: bytes) -> _Click | None:
    """The approval click in a form-encoded interactivity body; None for any other
    interaction (a link button, a shortcut); ValueError if it is malformed."""
    form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    payload = orjson.loads(form["payload"][0]) if "payload" in form else None
    if not isinstance(payload, dict):
        raise ValueError("no payload")
    if payload.get("type") != "block_actions":
        return None
    actions = payload.get("actions")
    ours = [
        a
        for a in (actions if isinstance(actions, list) else [])
        if isinstance(a, dict) and a.get("action_id") in (ACTION_APPROVE, ACTION_DENY)
    ]
    if not ours:
        return None
    action = ours[0]
    key, decision, intent = parse_button(str(action["action_id"]), str(action.get("value")))
    user, team = payload.get("user"), payload.get("team")
    user_id = user.get("id") if isinstance(user, dict) else None
    if not isinstance(user_id, str) or not user_id:
        raise ValueError("no user")
    team_id = team.get("id") if isinstance(team, dict) else None
    response_url = payload.get("response_url")
    return _Click(
        user_id=user_id,
        team_id=team_id if isinstance(team_id, str) else None,
        idem_key=key,
        action=decision,
        intent=intent,
        response_url=response_url if isinstance(response_url, str) else None,
    )


class SlackInteractivity:
    """The ``POST /slack/interactivity`` endpoint of a console."""

    def __init__(
        self, store: Store, authorize: Authorize, settings: SlackSettings, separation: bool
    ) -> None:
        self.store = store
        self.approvals = approval_store(store)
        self._authorize = authorize
        self.settings = settings
        self._separation = separation
        self._seen: dict[str, float] = {}

    async def handle(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            verify_slack_request(
                self.settings.signing_secret,
                timestamp=request.headers.get("x-slack-request-timestamp"),
                body=body,
                signature=request.headers.get("x-slack-signature"),
            )
            self._first_time(request.headers["x-slack-signature"])
        except BadSlackRequest as bad:
            logger.warning("Slack interactivity request refused: %s", bad)
            return PlainTextResponse(str(bad), bad.status)
        try:
            click = _click(body)
        except (ValueError, KeyError, TypeError):
            return PlainTextResponse("not an interaction this endpoint understands", 400)
        if click is None:
            return Response(status_code=200)  # a link button or another interaction
        # Acknowledge now; decide and post the outcome after the reply is sent.
        return Response(status_code=200, background=BackgroundTask(self._answer, click))

    async def _body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BadSlackRequest("the request body is too large", 413)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BadSlackRequest("the request body is too large", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    def _first_time(self, signature: str) -> None:
        """Refuse a verified request this process has already taken (an exact replay
        inside the five minutes); remember its signature as long as it could verify."""
        now = time.monotonic()
        if len(self._seen) >= _SEEN_LIMIT:
            self._seen = {s: t for s, t in self._seen.items() if t > now}
            while len(self._seen) >= _SEEN_LIMIT:
                del self._seen[next(iter(self._seen))]
        if self._seen.get(signature, 0.0) > now:
            raise BadSlackRequest("this request was already received (a replay)")
        self._seen[signature] = now + 2 * TOLERANCE_SECONDS

    async def _principal(self, click: _Click) -> str | None:
        wanted = self.settings.team_id
        if wanted is not None and click.team_id != wanted:
            return None
        users = self.settings.users
        found: object = (
            users.get(click.user_id) if isinstance(users, Mapping) else users(click.user_id)
        )
        if inspect.isawaitable(found):
            found = await found
        return found if isinstance(found, str) and found.strip() else None

    async def _answer(self, click: _Click) -> None:
        try:
            reply = await self._decide(click)
        except Exception:
            logger.exception("a Slack click on %s could not be decided", click.idem_key)
            reply = _ephemeral(
                "agent-ledger could not record this decision: nothing changed. "
                "Try again, or decide in the console."
            )
        await self._respond(click, reply)

    async def _decide(self, click: _Click) -> dict[str, Any]:
        principal = await self._principal(click)
        if principal is None:
            who = f"slack:{click.team_id or '-'}:{click.user_id}"
            attempt = NewDecisionAttempt(
                click.idem_key, who, Channel.SLACK, click.action, click.intent
            )
            await refuse(self.store, attempt, DecisionCode.UNMAPPED_USER, "unmapped Slack user")
            return _ephemeral(
                "Your Slack account is not mapped to an approver of agent-ledger: "
                "nothing changed. Ask an administrator to add you."
            )
        effect = await self.store.find(click.idem_key)
        if effect is not None and not await may_decide(self._authorize, principal, effect.tool):
            attempt = NewDecisionAttempt(
                click.idem_key, principal, Channel.SLACK, click.action, click.intent
            )
            await refuse(self.store, attempt, DecisionCode.NOT_ALLOWED, "not allowed")
            return _ephemeral(f"{principal} may not decide {effect.tool}: nothing changed.")
        outcome = await decide(
            self.store,
            click.idem_key,
            action=click.action,
            principal=principal,
            channel=Channel.SLACK,
            shown_intent=click.intent,
            separation_of_duty=self._separation,
        )
        if outcome.accepted and outcome.effect is not None:
            line = _decided_line(outcome.effect, click.action, principal)
            return await self._replace(outcome.effect, line)
        if outcome.reason in _SETTLED and outcome.effect is not None:
            return await self._replace(outcome.effect, outcome.message)
        return _ephemeral(f"Refused: {outcome.message}")

    async def _replace(self, effect: Effect, line: str) -> dict[str, Any]:
        request = await self.approvals.approval_request(effect.idem_key)
        blocks = approval_blocks(
            effect, request, console_url=self.settings.console_url, outcome=line
        )
        return {"replace_original": True, "text": escape_mrkdwn(line), "blocks": blocks}

    async def _respond(self, click: _Click, reply: dict[str, Any]) -> None:
        url = click.response_url
        if url is None:
            return
        if not self.settings.may_post_to(url):
            logger.warning("Slack response_url %r is not an allowed origin: not posted", url)
            return
        import httpx

        try:
            async with httpx.AsyncClient(timeout=self.settings.timeout) as client:
                sent = await client.post(
                    url,
                    content=orjson.dumps(reply),
                    headers={"Content-Type": "application/json; charset=utf-8"},
                )
            if sent.status_code >= 300:
                logger.warning("Slack response_url answered HTTP %s", sent.status_code)
        except httpx.HTTPError as failed:
            # The decision stands; the message keeps its buttons, and a second
            # click is told "already decided by ...".
            logger.warning("posting a Slack click's outcome failed: %s", failed)


#: Refusals after which nobody can decide from the message: it is replaced.
_SETTLED: Final = frozenset({DecisionCode.ALREADY_DECIDED, DecisionCode.EXPIRED})


def _decided_line(effect: Effect, action: DecisionAction, principal: str) -> str:
    verb = "Approved" if action is DecisionAction.APPROVE else "Denied"
    when = effect.decided_at.strftime(" at %Y-%m-%d %H:%M:%S UTC") if effect.decided_at else ""
    return f"{verb} by {principal}{when} (via Slack)"


def _ephemeral(text: str) -> dict[str, Any]:
    return {"response_type": "ephemeral", "replace_original": False, "text": escape_mrkdwn(text)}
