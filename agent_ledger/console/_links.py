"""Signed, expiring, single-use approve/deny links (for email and chat).

A link's token is ``base64url(payload).base64url(HMAC-SHA256(secret, payload))``;
the payload binds the effect key, the intent hash the recipient will be shown
(which names the approval round, so a link outlives no round it was sent for),
the action, the recipient (the principal the decision is recorded for), the
expiry and a random nonce. The standard library's ``hmac`` does it: no new
dependency, and nothing in the token is trusted before the MAC verifies
(compared in constant time). The nonce is consumed in the decision's own
transaction (``ApprovalStore.decide``), so a link decides at most once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import orjson

from agent_ledger.approvals import DecisionAction, UsedLink, is_intent_hash

__all__ = ["LINK_ACTIONS", "BadLink", "Link", "sign_link", "verify_link"]

#: What a link may do; resolve needs an outcome, which a link cannot carry.
LINK_ACTIONS: Final = frozenset({DecisionAction.APPROVE, DecisionAction.DENY})


class BadLink(Exception):
    """A link that does not verify (``status`` 403) or has expired (410)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Link:
    """What a verified token says."""

    idem_key: str
    intent_hash: str
    action: DecisionAction
    principal: str
    expires_at: datetime
    nonce: str

    def used(self) -> UsedLink:
        return UsedLink(self.nonce, self.action, self.expires_at)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, b"agent-ledger link v1\n" + payload, hashlib.sha256).digest()


def sign_link(
    secret: bytes,
    *,
    idem_key: str,
    intent_hash: str,
    action: DecisionAction,
    principal: str,
    ttl: timedelta,
    now: datetime | None = None,
) -> str:
    """A token for ``/links/<token>``: ``principal`` may take ``action`` on the effect
    until ``ttl`` from now, once."""
    if len(secret) < 32:
        raise ValueError("the link secret must be at least 32 bytes")
    if not is_intent_hash(intent_hash):
        raise ValueError("intent_hash must be 64 lowercase hex digits")
    if DecisionAction(action) not in LINK_ACTIONS:
        raise ValueError(
            f"a link may approve or deny, not {DecisionAction(action).value}: resolving an "
            "ambiguous attempt needs its outcome, so it is done in the console"
        )
    expires = (now or datetime.now(UTC)) + ttl
    payload = orjson.dumps(
        {
            "k": idem_key,
            "i": intent_hash,
            "a": DecisionAction(action).value,
            "p": principal,
            "e": int(expires.timestamp()),
            "n": secrets.token_hex(16),
        }
    )
    return f"{_b64(payload)}.{_b64(_mac(secret, payload))}"


def verify_link(secret: bytes, token: str, *, now: datetime | None = None) -> Link:
    """The link ``token`` carries; ``BadLink`` (403 forged or tampered, 410 expired)."""
    try:
        encoded, _, mac = token.partition(".")
        payload = _unb64(encoded)
        given = _unb64(mac)
    except (ValueError, binascii.Error):
        raise BadLink("this link is not valid", 403) from None
    if not hmac.compare_digest(given, _mac(secret, payload)):
        raise BadLink("this link is not valid", 403)
    try:
        data = orjson.loads(payload)
        link = Link(
            idem_key=str(data["k"]),
            intent_hash=str(data["i"]),
            action=DecisionAction(data["a"]),
            principal=str(data["p"]),
            expires_at=datetime.fromtimestamp(int(data["e"]), UTC),
            nonce=str(data["n"]),
        )
    except (ValueError, KeyError, TypeError):
        raise BadLink("this link is not valid", 403) from None
    if link.action not in LINK_ACTIONS:
        raise BadLink("a link may only approve or deny", 403)
    if link.expires_at <= (now or datetime.now(UTC)):
        raise BadLink("this link has expired", 410)
    return link
