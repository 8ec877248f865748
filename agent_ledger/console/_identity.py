"""Who is asking: authentication hooks (request -> principal) and the authorization rule.

Identity comes from the deployment, never from the request body: a trusted
reverse proxy's header (only from configured proxy addresses), or a static
list of users with scrypt-hashed passwords (HTTP Basic, for small teams).
Any callable ``request -> principal | None`` (sync or async) works too.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
import inspect
import ipaddress
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final

from starlette.requests import Request

__all__ = [
    "Authenticate",
    "Authorize",
    "ProxyHeaderAuth",
    "StaticUsers",
    "ToolPatterns",
    "hash_password",
    "may_decide",
]

_log = logging.getLogger("agent_ledger.console")

#: ``request -> principal`` (None: not authenticated); may be async.
Authenticate = Callable[[Request], "str | Awaitable[str | None] | None"]
#: ``(principal, tool) -> may decide``; may be async. Anything but ``True`` or
#: ``False`` (awaited) is a refusal, logged as the rule's error.
Authorize = Callable[[str, str], "bool | Awaitable[bool]"]


async def may_decide(authorize: Authorize, principal: str, tool: str) -> bool:
    """``authorize``'s answer, awaited when it is async. Anything but ``True`` or
    ``False`` is a refusal (fail closed), logged as the rule's error: a coroutine
    or a non-empty string is truthy, and must not let anyone decide."""
    answer: object = authorize(principal, tool)
    if inspect.isawaitable(answer):
        answer = await answer
    if isinstance(answer, bool):
        return answer
    _log.error(
        "the authorize rule returned %s, not a bool: %s is refused %s",
        type(answer).__name__,
        principal,
        tool,
    )
    return False


# scrypt's cost: n=2**14, r=8, p=1 (about 16 MiB, tens of ms): RFC 7914's
# interactive-login figure.
_N: Final = 2**14
_R: Final = 8
_P: Final = 1


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """``scrypt$n$r$p$salt$hash`` (base64) of ``password``, for :class:`StaticUsers`."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    b64 = base64.b64encode
    return f"scrypt${_N}${_R}${_P}${b64(salt).decode()}${b64(digest).decode()}"


def _verify(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        expected = base64.b64decode(digest)
        got = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
        )
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(got, expected)


class StaticUsers:
    """HTTP Basic against ``{user: hash_password(...)}``; the user name is the principal."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = dict(users)
        # An unknown name is checked against this, so it costs what a known one
        # does: the time of a refusal does not tell which names exist.
        self._dummy = hash_password(secrets.token_urlsafe(16))

    def __call__(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            return None
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return None
        stored = self._users.get(user)
        matches = _verify(password, self._dummy if stored is None else stored)
        return user if sep and stored is not None and matches else None


class ProxyHeaderAuth:
    """The principal a trusted reverse proxy (oauth2-proxy, an identity-aware proxy)
    puts in ``header``, believed only when the connection comes from one of
    ``trusted_proxies`` (addresses or networks). From anywhere else the header
    is ignored: anyone could send it.

    ``secret_header`` and ``secret``: the proxy also sends this header with
    this shared secret (nginx: ``proxy_set_header X-Proxy-Secret ...``), and
    a request without it (compared in constant time) is nobody's. Use it when
    other processes share the proxy's address (a proxy on the same host: any
    local process connects from 127.0.0.1 too)."""

    def __init__(
        self,
        *,
        header: str = "X-Forwarded-Email",
        trusted_proxies: Iterable[str],
        secret_header: str | None = None,
        secret: str | None = None,
    ) -> None:
        self.header = header
        self._networks = [ipaddress.ip_network(p, strict=False) for p in trusted_proxies]
        if not self._networks:
            raise ValueError("trusted_proxies must name at least one proxy address")
        if (secret_header is None) != (secret is None):
            raise ValueError("secret_header and secret go together: give both or neither")
        if secret is not None and len(secret) < 16:
            raise ValueError("secret must have at least 16 characters")
        self._secret_header = secret_header
        self._secret = secret.encode() if secret is not None else None

    def __call__(self, request: Request) -> str | None:
        client = request.client
        if client is None:
            return None
        try:
            address = ipaddress.ip_address(client.host)
        except ValueError:
            return None
        if not any(address in network for network in self._networks):
            return None
        if self._secret_header is not None and self._secret is not None:
            sent = request.headers.get(self._secret_header, "").encode()
            if not hmac.compare_digest(sent, self._secret):
                return None
        value = request.headers.get(self.header, "").strip()
        return value or None


class ToolPatterns:
    """Who may decide which tools: ``{principal: ["pay*", "refund"]}`` (fnmatch
    patterns; ``"*"`` as a principal applies to everyone authenticated)."""

    def __init__(self, rules: Mapping[str, Iterable[str]]) -> None:
        self._rules = {who: tuple(patterns) for who, patterns in rules.items()}

    def __call__(self, principal: str, tool: str) -> bool:
        patterns = self._rules.get(principal, ()) + self._rules.get("*", ())
        return any(fnmatch.fnmatchcase(tool, pattern) for pattern in patterns)
