"""The approval console (issue 28): an ASGI app a person decides from.

Needs the ``console`` extra (Starlette, Jinja2; uvicorn to serve it alone):
``pip install -e ".[console]"``. ``import agent_ledger`` never imports it.
See docs/console.md.
"""

from __future__ import annotations

from agent_ledger.console._app import create_app
from agent_ledger.console._identity import (
    ProxyHeaderAuth,
    StaticUsers,
    ToolPatterns,
    hash_password,
)
from agent_ledger.console._links import BadLink, Link, sign_link, verify_link
from agent_ledger.console._slack import BadSlackRequest, SlackSettings, verify_slack_request
from agent_ledger.console._slack_messages import (
    SlackError,
    SlackMessage,
    approval_blocks,
    post_approval_request,
)

__all__ = [
    "BadLink",
    "BadSlackRequest",
    "Link",
    "ProxyHeaderAuth",
    "SlackError",
    "SlackMessage",
    "SlackSettings",
    "StaticUsers",
    "ToolPatterns",
    "approval_blocks",
    "create_app",
    "hash_password",
    "post_approval_request",
    "sign_link",
    "verify_link",
    "verify_slack_request",
]
