"""The console fails closed and clearly on what a person, a rule or a forger sends:
an async or non-bool authorization rule, a non-ASCII CSRF token, an oversized
body or note, a link signed for ``resolve``; separation of duty does not care
about the case of a name, and a login for an unknown name costs what a known
one does. Nothing stored changes on any of these."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
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
from agent_ledger.console import (
    StaticUsers,
    ToolPatterns,
    _identity,
    _links,
    create_app,
    hash_password,
    sign_link,
    verify_link,
)
from agent_ledger.console._app import MAX_BODY_BYTES
from agent_ledger.console._identity import Authorize
from agent_ledger.deciding import MAX_NOTE_CHARS, approval_store, decide, effect_intent
from agent_ledger.effects import Effect

SECRET = b"b" * 32
ORIGIN = "http://console.test"
USERS = {"alice": hash_password("alice-pw"), "bob": hash_password("bob-pw")}
PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 12_500}, workflow_id="wf-bad")
PARK = RunOptions(requires_approval=True, wait_for_approval=False)


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ALICE = _basic("alice", "alice-pw")
BOB = _basic("bob", "bob-pw")


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[EffectLedger]:
    led = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    yield led
    await led.store.close()


async def _park(ledger: EffectLedger) -> Effect:
    with pytest.raises(ApprovalPendingError):
        await ledger.run(PAY, lambda e: "paid", PARK)
    effect = await ledger.store.find(ledger.idem_key(PAY))
    assert effect is not None
    return effect


def _client(ledger: EffectLedger, authorize: object = None) -> httpx.AsyncClient:
    rule: Authorize = authorize or ToolPatterns({"alice": ["pay"]})  # type: ignore[assignment]
    app = create_app(ledger, authenticate=StaticUsers(USERS), authorize=rule, secret=SECRET)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)


def _field(html: str, name: str) -> str | None:
    found = re.search(rf'name="{name}" value="([0-9a-f]+)"', html)
    return found.group(1) if found else None


async def _unchanged(ledger: EffectLedger, effect: Effect) -> None:
    now = await ledger.store.find(effect.idem_key)
    assert now is not None
    assert (now.status, now.decided_by, now.updated_at) == (
        EffectStatus.REQUIRES_APPROVAL,
        None,
        effect.updated_at,
    )


def _csrf(principal: str) -> str:
    """The console's CSRF token for ``principal`` (an HMAC of it under the secret)."""
    return hmac.new(SECRET, b"csrf\n" + principal.encode(), hashlib.sha256).hexdigest()


async def _post_as(
    client: httpx.AsyncClient, effect: Effect, who: str, **form: str
) -> httpx.Response:
    data = {
        "csrf": _csrf(who),
        "intent": effect_intent(effect, None),
        "action": "approve",
        **form,
    }
    headers = {**_basic(who, f"{who}-pw"), "Origin": ORIGIN}
    return await client.post(f"/effects/{effect.idem_key}/decide", headers=headers, data=data)


async def test_an_async_authorize_rule_is_awaited(ledger: EffectLedger) -> None:
    async def only_alice(principal: str, tool: str) -> bool:
        return principal == "alice"

    effect = await _park(ledger)
    async with _client(ledger, only_alice) as client:
        bob_page = await client.get(f"/effects/{effect.idem_key}", headers=BOB)
        assert 'name="action"' not in bob_page.text  # no form for bob
        refused = await _post_as(client, effect, "bob")
        assert refused.status_code == 403
        await _unchanged(ledger, effect)
        accepted = await _post_as(client, effect, "alice")
    assert accepted.status_code == 303
    done = await ledger.store.find(effect.idem_key)
    assert done is not None and done.decided_by == "alice"


@pytest.mark.parametrize("answer", ["yes", 1, None, [True]])
async def test_an_authorize_answer_that_is_not_a_bool_is_a_logged_refusal(
    ledger: EffectLedger, answer: object, caplog: pytest.LogCaptureFixture
) -> None:
    async def sloppy(principal: str, tool: str) -> object:
        return answer

    effect = await _park(ledger)
    with caplog.at_level(logging.ERROR, logger="agent_ledger.console"):
        async with _client(ledger, sloppy) as client:
            response = await _post_as(client, effect, "alice")
    assert response.status_code == 403
    await _unchanged(ledger, effect)
    assert any("not a bool" in r.getMessage() for r in caplog.records)
    (row,) = await approval_store(ledger.store).decision_attempts(effect.idem_key)
    assert (row.outcome, row.reason_code) == (DecisionOutcome.REFUSED, DecisionCode.NOT_ALLOWED)


@pytest.mark.parametrize("token", ["é" * 64, "☃", "x" * 64])
async def test_a_csrf_token_that_is_not_ascii_is_a_403_not_a_crash(
    ledger: EffectLedger, token: str
) -> None:
    effect = await _park(ledger)
    link = sign_link(
        SECRET,
        idem_key=effect.idem_key,
        intent_hash=effect_intent(effect, None),
        action=DecisionAction.APPROVE,
        principal="alice",
        ttl=timedelta(hours=1),
    )
    async with _client(ledger) as client:
        form = await _post_as(client, effect, "alice", csrf=token)
        by_link = await client.post(
            f"/links/{link}", headers={"Origin": ORIGIN}, data={"csrf": token}
        )
    assert form.status_code == 403 and "expired" in form.text
    assert by_link.status_code == 403
    await _unchanged(ledger, effect)


async def test_a_body_over_the_limit_is_413_and_changes_nothing(ledger: EffectLedger) -> None:
    effect = await _park(ledger)
    async with _client(ledger) as client:
        response = await _post_as(client, effect, "alice", note="n" * (MAX_BODY_BYTES + 1))

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            for _ in range(MAX_BODY_BYTES // 1024 + 2):
                yield b"x" * 1024

        streamed = await client.post(
            f"/effects/{effect.idem_key}/decide",
            headers={**ALICE, "Origin": ORIGIN},
            content=chunks(),
        )
    assert response.status_code == 413 and streamed.status_code == 413
    assert "64 KiB" in response.text
    await _unchanged(ledger, effect)
    assert await approval_store(ledger.store).decision_attempts(effect.idem_key) == []


async def test_a_note_over_the_limit_is_400_and_audited_without_it(ledger: EffectLedger) -> None:
    effect = await _park(ledger)
    async with _client(ledger) as client:
        page = await client.get(f"/effects/{effect.idem_key}", headers=ALICE)
        assert f'maxlength="{MAX_NOTE_CHARS}"' in page.text
        response = await _post_as(client, effect, "alice", note="n" * (MAX_NOTE_CHARS + 1))
    assert response.status_code == 400 and f"{MAX_NOTE_CHARS:,} characters" in response.text
    await _unchanged(ledger, effect)
    (row,) = await approval_store(ledger.store).decision_attempts(effect.idem_key)
    assert (row.outcome, row.reason_code, row.note) == (
        DecisionOutcome.REFUSED,
        DecisionCode.NOTE_TOO_LONG,
        None,
    )
    # Exactly the limit is fine, from any channel.
    done = await decide(
        ledger.store,
        effect.idem_key,
        action=DecisionAction.DENY,
        principal="alice",
        channel=Channel.CLI,
        shown_intent=None,
        note="n" * MAX_NOTE_CHARS,
    )
    assert done.accepted and done.effect is not None
    # A denial's note is its reason: the error every caller is told.
    assert done.effect.error is not None
    assert done.effect.error.message == "n" * MAX_NOTE_CHARS


async def test_a_link_may_not_resolve(ledger: EffectLedger) -> None:
    effect = await _park(ledger)
    with pytest.raises(ValueError, match="approve or deny"):
        sign_link(
            SECRET,
            idem_key=effect.idem_key,
            intent_hash=effect_intent(effect, None),
            action=DecisionAction.RESOLVE,
            principal="alice",
            ttl=timedelta(hours=1),
        )
    # A token someone with the secret built by hand for resolve.
    payload = orjson.dumps(
        {
            "k": effect.idem_key,
            "i": effect_intent(effect, None),
            "a": "resolve",
            "p": "alice",
            "e": int((datetime.now(UTC) + timedelta(hours=1)).timestamp()),
            "n": "ab" * 16,
        }
    )
    token = f"{_links._b64(payload)}.{_links._b64(_links._mac(SECRET, payload))}"
    with pytest.raises(_links.BadLink):
        verify_link(SECRET, token)
    async with _client(ledger) as client:
        shown = await client.get(f"/links/{token}")
        posted = await client.post(
            f"/links/{token}", headers={"Origin": ORIGIN}, data={"csrf": "0" * 64}
        )
    assert shown.status_code == 403 and "approve or deny" in shown.text
    assert posted.status_code == 403
    await _unchanged(ledger, effect)


@pytest.mark.parametrize("asker", ["Alice@Example.com", "alice@example.com ", "ALICE@EXAMPLE.COM"])
async def test_separation_of_duty_ignores_the_case_of_a_name(
    ledger: EffectLedger, asker: str
) -> None:
    effect = await _park(ledger)
    await approval_store(ledger.store).renew_request(
        effect.idem_key, requested_by=asker, policy_version=None, deadline_ms=None
    )
    refused = await decide(
        ledger.store,
        effect.idem_key,
        action=DecisionAction.APPROVE,
        principal="alice@example.com",
        channel=Channel.CONSOLE,
        shown_intent=effect_intent(effect, None),
        separation_of_duty=True,
    )
    assert not refused.accepted and refused.reason is DecisionCode.SELF_DECISION
    await _unchanged(ledger, effect)


async def test_an_unknown_user_name_costs_one_password_check_like_a_known_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[str] = []
    real = _identity._verify

    def counted(password: str, stored: str) -> bool:
        checks.append(password)
        return real(password, stored)

    monkeypatch.setattr(_identity, "_verify", counted)
    users = StaticUsers(USERS)
    scope = {"type": "http", "method": "GET", "path": "/", "query_string": b""}
    from starlette.requests import Request

    def asking(headers: dict[str, str]) -> Request:
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        return Request({**scope, "headers": raw})

    assert users(asking(_basic("mallory", "guess"))) is None
    assert users(asking(_basic("alice", "guess"))) is None
    assert users(asking(_basic("alice", "alice-pw"))) == "alice"
    assert checks == ["guess", "guess", "alice-pw"]


def test_the_documented_limits_are_the_enforced_ones() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "console.md").read_text()
    assert f"at most {MAX_NOTE_CHARS:,} characters" in docs
    assert f"over {MAX_BODY_BYTES // 1024} KiB gets 413" in docs
