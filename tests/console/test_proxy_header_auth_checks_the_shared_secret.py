"""A proxy on the same host shares its address with every local process (c04).

``ProxyHeaderAuth(secret_header=..., secret=...)`` believes the identity
header only when the request also carries the proxy's shared secret, so a
local process that connects from 127.0.0.1 and names an approver is nobody.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.requests import Request

from agent_ledger.cli import PROXY_SECRET_ENV, main
from agent_ledger.console import ProxyHeaderAuth

SECRET = "proxy-secret-0123456789"


def _request(host: str, headers: dict[str, str]) -> Request:
    return Request(
        {
            "type": "http",
            "method": "POST",
            "path": "/",
            "client": (host, 40_000),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
    )


def test_the_header_counts_only_with_the_shared_secret() -> None:
    auth = ProxyHeaderAuth(
        trusted_proxies=["127.0.0.1"], secret_header="X-Proxy-Secret", secret=SECRET
    )
    boss = {"X-Forwarded-Email": "boss@corp.example"}
    assert auth(_request("127.0.0.1", {**boss, "X-Proxy-Secret": SECRET})) == "boss@corp.example"
    # A local process without the secret, or with a wrong one, is nobody.
    assert auth(_request("127.0.0.1", boss)) is None
    assert auth(_request("127.0.0.1", {**boss, "X-Proxy-Secret": SECRET[:-1] + "x"})) is None
    # The secret does not stand in for the proxy's address.
    assert auth(_request("10.9.9.9", {**boss, "X-Proxy-Secret": SECRET})) is None
    # Without a secret configured, the address alone decides (as before).
    plain = ProxyHeaderAuth(trusted_proxies=["127.0.0.1"])
    assert plain(_request("127.0.0.1", boss)) == "boss@corp.example"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"secret_header": "X-Proxy-Secret"},
        {"secret": SECRET},
        {"secret_header": "X", "secret": "short"},
    ],
)
def test_a_half_or_weak_secret_is_refused(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="secret"):
        ProxyHeaderAuth(trusted_proxies=["127.0.0.1"], **kwargs)


def test_the_cli_needs_the_secret_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(PROXY_SECRET_ENV, raising=False)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert main(["init", "--url", url]) == 0
    argv = [
        "--url",
        url,
        "console",
        "--proxy-header",
        "X-Forwarded-Email",
        "--trusted-proxy",
        "127.0.0.1",
        "--proxy-secret-header",
        "X-Proxy-Secret",
        "--allow",
        "boss:pay",
    ]
    assert main(argv) != 0
    assert PROXY_SECRET_ENV in capsys.readouterr().err
