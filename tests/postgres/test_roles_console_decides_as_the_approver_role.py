"""The approval console on a connection that logs in as an approver works
with the role set installed: the person it authenticates decides, the
database records its own identity of the session as the decider, and the
audit trail keeps the person. A console connected as a worker changes nothing."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from agent_ledger import ApprovalPendingError, RunOptions, ToolCall
from agent_ledger.approvals import DecisionOutcome
from agent_ledger.console import StaticUsers, ToolPatterns, create_app, hash_password
from agent_ledger.deciding import effect_intent
from agent_ledger.effects import Effect
from agent_ledger.status import EffectStatus
from agent_ledger.testing import build_ledger
from tests.postgres.roles_world import RoleWorld, role_world

SECRET = b"s" * 32
ORIGIN = "http://console.test"
PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 4_200}, workflow_id="wf-console")
ALICE = {"Authorization": "Basic " + base64.b64encode(b"alice:alice-pw").decode()}


@pytest.fixture
async def world() -> AsyncIterator[RoleWorld]:
    async with role_world() as made:
        yield made


def _client(store: object) -> httpx.AsyncClient:
    app = create_app(
        store,
        authenticate=StaticUsers({"alice": hash_password("alice-pw")}),
        authorize=ToolPatterns({"alice": ["pay"]}),
        secret=SECRET,
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)


async def _approve(client: httpx.AsyncClient, effect: Effect) -> httpx.Response:
    page = await client.get(f"/effects/{effect.idem_key}", headers=ALICE)
    assert page.status_code == 200
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert csrf is not None
    return await client.post(
        f"/effects/{effect.idem_key}/decide",
        headers={**ALICE, "Origin": ORIGIN},
        data={
            "csrf": csrf.group(1),
            "intent": effect_intent(effect, None),
            "action": "approve",
            "note": "ok",
        },
    )


async def test_the_console_decides_through_an_approver_login(world: RoleWorld) -> None:
    worker = build_ledger(await world.store("worker"))
    with pytest.raises(ApprovalPendingError):
        await worker.run(
            PAY,
            lambda e: {"paid": True},
            RunOptions(requires_approval=True, wait_for_approval=False),
        )
    effect = await worker.store.find(worker.idem_key(PAY))
    assert effect is not None
    waiting = asyncio.create_task(worker.run(PAY, lambda e: {"paid": e.args["cents"]}))
    approver_store = await world.store("approver")
    async with _client(approver_store) as client:
        listed = await client.get("/", headers=ALICE)
        assert listed.status_code == 200 and "pay" in listed.text
        posted = await _approve(client, effect)
    assert posted.status_code == 303
    assert await asyncio.wait_for(waiting, 10) == {"paid": 4_200}
    done = await world.admin.find(effect.idem_key)
    assert done is not None and done.status is EffectStatus.SUCCEEDED
    assert done.decided_by == world.logins["approver"]
    (attempt,) = await world.admin.decision_attempts(effect.idem_key)
    assert (attempt.principal, attempt.outcome) == ("alice", DecisionOutcome.ACCEPTED)


async def test_a_console_connected_as_a_worker_changes_nothing(world: RoleWorld) -> None:
    worker = build_ledger(await world.store("worker"))
    with pytest.raises(ApprovalPendingError):
        await worker.run(
            PAY,
            lambda e: {"paid": True},
            RunOptions(requires_approval=True, wait_for_approval=False),
        )
    effect = await worker.store.find(worker.idem_key(PAY))
    assert effect is not None
    async with _client(worker.store) as client:
        refused = await _approve(client, effect)
    # The database's refusal is a page saying why, not a server error.
    assert refused.status_code == 403 and "not an approver" in refused.text
    assert await world.admin.find(effect.idem_key) == effect
    assert await world.admin.decision_attempts(effect.idem_key) == []
