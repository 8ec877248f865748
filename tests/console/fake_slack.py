"""A local fake of Slack for the Slack tests: its Web API's chat.postMessage and the
response_url hooks, served by uvicorn on a free local port, recording what it is
sent. Never the network. Also: signing a click the way Slack does."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlencode

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent_ledger import EffectLedger

BOT_TOKEN = "xoxb-test-token"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


class FakeSlack:
    """What Slack was sent: ``posted`` (chat.postMessage bodies) and ``hooks``
    (response_url bodies, in order of arrival). ``hold`` pauses every
    response_url reply until it is set."""

    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []
        self.hooks: list[dict[str, Any]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self._arrived = asyncio.Condition()
        self.base_url = ""

    async def post_message(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {BOT_TOKEN}":
            return JSONResponse({"ok": False, "error": "invalid_auth"})
        body = orjson.loads(await request.body())
        self.posted.append(body)
        return JSONResponse({"ok": True, "channel": body["channel"], "ts": "1700000000.000100"})

    async def hook(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        async with self._arrived:
            self.hooks.append(body)
            self._arrived.notify_all()
        await self.hold.wait()
        return Response("ok")

    async def wait_for_hooks(self, count: int) -> list[dict[str, Any]]:
        """The response_url posts once ``count`` have arrived (at most 10 s)."""
        async with asyncio.timeout(10), self._arrived:
            await self._arrived.wait_for(lambda: len(self.hooks) >= count)
        return list(self.hooks)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/chat.postMessage", self.post_message, methods=["POST"]),
                Route("/hooks/{name}", self.hook, methods=["POST"]),
            ]
        )


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in this event loop on a free local port; its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=5
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def sign(body: bytes, timestamp: int | None = None, secret: str = SIGNING_SECRET) -> dict[str, str]:
    """Slack's headers for ``body``: its v0 signature at ``timestamp`` (default: now)."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    mac = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": f"v0={mac}",
        "Content-Type": "application/x-www-form-urlencoded",
    }


def click_body(
    *,
    action_id: str,
    value: str,
    user: str,
    response_url: str,
    team: str = "T0001",
) -> bytes:
    """The form body Slack posts when ``user`` clicks a button (a block_actions payload)."""
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "team_id": team},
        "team": {"id": team, "domain": "example"},
        "api_app_id": "A0001",
        "container": {"type": "message", "message_ts": "1700000000.000100"},
        "channel": {"id": "C0001", "name": "approvals"},
        "response_url": response_url,
        "trigger_id": "1.2.3",
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "b1",
                "value": value,
                "action_ts": "1700000001.000200",
            }
        ],
    }
    return urlencode({"payload": orjson.dumps(payload).decode()}).encode()


def button(message: dict[str, Any], action_id: str) -> dict[str, Any]:
    """The button ``action_id`` of a posted message's blocks."""
    for block in message["blocks"]:
        for element in block.get("elements", ()):
            if element.get("action_id") == action_id:
                return dict(element)
    raise AssertionError(f"no {action_id} button in {message}")


ALICE, BOB, CAROL, STRANGER = "U0ALICE", "U0BOB", "U0CAROL", "U0STRANGER"
#: Slack user id -> principal; STRANGER is not mapped.
USERS = {ALICE: "alice", BOB: "bob", CAROL: "carol"}


class World:
    """A ledger, its console (with Slack on) and the fake Slack, both served on local ports."""

    def __init__(
        self, ledger: EffectLedger, slack: FakeSlack, console_url: str, slack_url: str
    ) -> None:
        self.ledger = ledger
        self.slack = slack
        self.console_url = console_url
        self.slack_url = slack_url
        self.client: Any = None

    @property
    def response_url(self) -> str:
        return f"{self.slack_url}/hooks/T0001-1"

    async def click(self, body: bytes, headers: dict[str, str] | None = None) -> Any:
        return await self.client.post(
            f"{self.console_url}/slack/interactivity",
            content=body,
            headers=headers if headers is not None else sign(body),
        )


@asynccontextmanager
async def world(
    ledger: EffectLedger,
    *,
    separation_of_duty: bool = False,
    authorize: Any = None,
    **settings: Any,
) -> AsyncIterator[World]:
    import httpx

    from agent_ledger.console import SlackSettings, ToolPatterns, create_app

    fake = FakeSlack()
    async with serve(fake.app()) as slack_url:
        options: dict[str, Any] = {
            "signing_secret": SIGNING_SECRET,
            "users": USERS,
            "console_url": "https://console.example/approvals",
            "response_url_origins": [slack_url],
        }
        options.update(settings)
        app = create_app(
            ledger,
            authenticate=lambda request: None,
            authorize=authorize
            or ToolPatterns({"alice": ["pay*"], "bob": ["pay*"], "carol": ["email"]}),
            secret=b"k" * 32,
            separation_of_duty=separation_of_duty,
            slack=SlackSettings(**options),
        )
        async with serve(app) as console_url, httpx.AsyncClient(timeout=10) as client:
            fake.base_url = slack_url
            here = World(ledger, fake, console_url, slack_url)
            here.client = client
            try:
                yield here
            finally:
                fake.hold.set()  # a held response_url reply never holds up the shutdown
