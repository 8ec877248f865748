"""The approval console over HTTP (httpx's ASGI transport, no server): who may see
and decide, CSRF and cross-origin refusals, exactly one of 20 concurrent POSTs
deciding, and signed links that decide once, only by POST."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.approvals import DecisionAction, DecisionOutcome
from agent_ledger.codes import DecisionCode
from agent_ledger.console import (
    ProxyHeaderAuth,
    StaticUsers,
    ToolPatterns,
    create_app,
    hash_password,
    sign_link,
)
from agent_ledger.deciding import approval_store, effect_intent
from agent_ledger.effects import Effect

SECRET = b"k" * 32
USERS = {"alice": hash_password("alice-pw"), "bob": hash_password("bob-pw")}
RULES = ToolPatterns({"alice": ["pay*"], "bob": ["email"]})
PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 12_500}, workflow_id="wf-1")
PARK = RunOptions(requires_approval=True, wait_for_approval=False)
ORIGIN = "http://console.test"


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


ALICE = _basic("alice", "alice-pw")
BOB = _basic("bob", "bob-pw")


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[EffectLedger]:
    led = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))
    yield led
    await led.store.close()


async def _park(ledger: EffectLedger, call: ToolCall = PAY) -> Effect:
    from agent_ledger import ApprovalPendingError

    with pytest.raises(ApprovalPendingError):
        await ledger.run(call, lambda e: {"paid": True}, PARK)
    effect = await ledger.store.find(ledger.idem_key(call))
    assert effect is not None
    return effect


def _client(ledger: EffectLedger, **kwargs: object) -> httpx.AsyncClient:
    app = create_app(ledger, authenticate=StaticUsers(USERS), authorize=RULES, secret=SECRET)
    transport = httpx.ASGITransport(app=app, **kwargs)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url=ORIGIN)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, html
    return found.group(1)


async def test_unauthenticated_is_401_and_a_wrong_password_too(ledger: EffectLedger) -> None:
    await _park(ledger)
    async with _client(ledger) as client:
        assert (await client.get("/")).status_code == 401
        assert (await client.get("/", headers=_basic("alice", "nope"))).status_code == 401
        page = await client.get("/", headers=ALICE)
    assert page.status_code == 200 and "pay" in page.text and "policy" in page.text


async def test_the_receipt_shows_the_args_exactly_and_an_approval_wakes_the_run(
    ledger: EffectLedger,
) -> None:
    effect = await _park(ledger)
    waiting = asyncio.create_task(ledger.run(PAY, lambda e: {"paid": e.args["cents"]}))
    async with _client(ledger) as client:
        page = await client.get(f"/effects/{effect.idem_key}", headers=ALICE)
        assert page.status_code == 200
        assert "&#34;cents&#34;: 12500" in page.text and "&#34;to&#34;: &#34;acme&#34;" in page.text
        posted = await client.post(
            f"/effects/{effect.idem_key}/decide",
            headers={**ALICE, "Origin": ORIGIN},
            data={
                "csrf": _csrf(page.text),
                "intent": effect_intent(effect, None),
                "action": "approve",
                "note": "ok",
            },
        )
    assert posted.status_code == 303
    assert await asyncio.wait_for(waiting, 10) == {"paid": 12500}
    done = await ledger.store.find(effect.idem_key)
    assert done is not None and done.decided_by == "alice"


async def test_a_principal_not_allowed_for_the_tool_gets_403_and_is_audited(
    ledger: EffectLedger,
) -> None:
    effect = await _park(ledger)
    async with _client(ledger) as client:
        page = await client.get(f"/effects/{effect.idem_key}", headers=BOB)
        assert "You may not decide pay" in page.text
        posted = await client.post(
            f"/effects/{effect.idem_key}/decide",
            headers={**BOB, "Origin": ORIGIN},
            data={"csrf": _csrf(page.text) if "csrf" in page.text else "", "action": "approve"},
        )
    assert posted.status_code in (403,)
    still = await ledger.store.find(effect.idem_key)
    assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL


async def test_cross_origin_and_csrf_less_posts_change_nothing(ledger: EffectLedger) -> None:
    effect = await _park(ledger)
    async with _client(ledger) as client:
        page = await client.get(f"/effects/{effect.idem_key}", headers=ALICE)
        form = {
            "csrf": _csrf(page.text),
            "intent": effect_intent(effect, None),
            "action": "approve",
        }
        url = f"/effects/{effect.idem_key}/decide"
        for headers in (
            {"Origin": "https://evil.example"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Origin": "null"},
        ):
            refused = await client.post(url, headers={**ALICE, **headers}, data=form)
            assert refused.status_code == 403, headers
        no_token = await client.post(
            url, headers={**ALICE, "Origin": ORIGIN}, data={**form, "csrf": "0" * 64}
        )
        assert no_token.status_code == 403
        # GET and HEAD of the decide URL are not routes that change anything.
        assert (await client.get(url, headers=ALICE)).status_code == 405
    still = await ledger.store.find(effect.idem_key)
    assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL


async def test_twenty_concurrent_posts_make_one_decision(ledger: EffectLedger) -> None:
    effect = await _park(ledger)
    async with _client(ledger) as client:
        page = await client.get(f"/effects/{effect.idem_key}", headers=ALICE)
        form = {
            "csrf": _csrf(page.text),
            "intent": effect_intent(effect, None),
            "action": "approve",
        }
        replies = await asyncio.gather(
            *(
                client.post(
                    f"/effects/{effect.idem_key}/decide",
                    headers={**ALICE, "Origin": ORIGIN},
                    data=form,
                )
                for _ in range(20)
            )
        )
    codes = sorted(r.status_code for r in replies)
    assert codes == [303] + [409] * 19
    assert all("already decided by alice at" in r.text for r in replies if r.status_code == 409)
    rows = await approval_store(ledger.store).decision_attempts(effect.idem_key)
    assert [r.outcome for r in rows].count(DecisionOutcome.ACCEPTED) == 1
    assert [r.reason_code for r in rows].count(DecisionCode.ALREADY_DECIDED) == 19


async def test_the_proxy_header_counts_only_from_a_trusted_proxy(ledger: EffectLedger) -> None:
    await _park(ledger)
    auth = ProxyHeaderAuth(header="X-Forwarded-Email", trusted_proxies=["10.0.0.0/24"])
    app = create_app(ledger, authenticate=auth, authorize=RULES, secret=SECRET)
    header = {"X-Forwarded-Email": "alice"}
    for client_addr, status in ((("10.0.0.7", 1), 200), (("192.0.2.9", 1), 401)):
        transport = httpx.ASGITransport(app=app, client=client_addr)
        async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as client:
            assert (await client.get("/", headers=header)).status_code == status


# -- links ---------------------------------------------------------------------


def _link(effect: Effect, *, ttl: timedelta = timedelta(hours=1), action: str = "approve") -> str:
    return sign_link(
        SECRET,
        idem_key=effect.idem_key,
        intent_hash=effect_intent(effect, None),
        action=DecisionAction(action),
        principal="alice",
        ttl=ttl,
    )


async def _confirm(client: httpx.AsyncClient, token: str) -> httpx.Response:
    page = await client.get(f"/links/{token}")
    if page.status_code != 200:
        return page
    return await client.post(
        f"/links/{token}", headers={"Origin": ORIGIN}, data={"csrf": _csrf(page.text)}
    )


async def test_a_link_get_changes_nothing_and_its_post_decides_once(ledger: EffectLedger) -> None:
    effect = await _park(ledger)
    token = _link(effect)
    async with _client(ledger) as client:
        for _ in range(3):  # a mail scanner following the link
            assert (await client.get(f"/links/{token}")).status_code == 200
            assert (await client.head(f"/links/{token}")).status_code == 200
        still = await ledger.store.find(effect.idem_key)
        assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
        page = await client.get(f"/links/{token}")
        done = await client.post(
            f"/links/{token}", headers={"Origin": ORIGIN}, data={"csrf": _csrf(page.text)}
        )
        assert done.status_code == 200
        again = await client.post(
            f"/links/{token}", headers={"Origin": ORIGIN}, data={"csrf": _csrf(page.text)}
        )
        assert again.status_code == 410
    decided = await ledger.store.find(effect.idem_key)
    assert decided is not None and decided.status is EffectStatus.READY
    assert decided.decided_by == "alice"
    rows = await approval_store(ledger.store).decision_attempts(effect.idem_key)
    assert [(r.channel.value, r.outcome.value) for r in rows] == [
        ("link", "accepted"),
        ("link", "refused"),
    ]


async def test_forged_tampered_expired_and_other_effect_links_change_nothing(
    ledger: EffectLedger,
) -> None:
    effect = await _park(ledger)
    other = await _park(ledger, ToolCall(tool="pay", args={"to": "x", "cents": 1}, workflow_id="w"))
    good = _link(effect)
    payload, mac = good.split(".")
    forged = sign_link(
        b"z" * 32,
        idem_key=effect.idem_key,
        intent_hash=effect_intent(effect, None),
        action=DecisionAction.APPROVE,
        principal="alice",
        ttl=timedelta(hours=1),
    )
    tampered = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1] + "." + mac
    # Signed for one effect, but carrying the intent of another: refused on the intent.
    crossed = sign_link(
        SECRET,
        idem_key=effect.idem_key,
        intent_hash=effect_intent(other, None),
        action=DecisionAction.APPROVE,
        principal="alice",
        ttl=timedelta(hours=1),
    )
    expired = _link(effect, ttl=timedelta(seconds=-1))
    async with _client(ledger) as client:
        for token, status in ((forged, 403), (tampered, 403), ("garbage", 403), (expired, 410)):
            got = await _confirm(client, token)
            assert got.status_code == status, token
        refused = await _confirm(client, crossed)
        assert refused.status_code == 403
    for key in (effect.idem_key, other.idem_key):
        still = await ledger.store.find(key)
        assert still is not None and still.status is EffectStatus.REQUIRES_APPROVAL
