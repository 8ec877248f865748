"""A decision the database refuses is a clear 403 page, never a server error.

With PostgreSQL's role set and separation of duty, the database may refuse a
console decision (no recorded asker; the console's login is the asker; the
login is no approver). The console answers 403 "Refused" saying why, and
nothing changed.
"""

from __future__ import annotations

import base64
import re

import httpx
import psycopg
import pytest
from psycopg import sql

from agent_ledger import ApprovalPendingError, RunOptions, ToolCall
from agent_ledger.console import StaticUsers, ToolPatterns, create_app, hash_password
from agent_ledger.status import EffectStatus
from agent_ledger.testing import build_ledger
from tests.harness import DSN
from tests.postgres.roles_world import role_world

ORIGIN = "http://console.test"
PAY = ToolCall(tool="pay", args={"to": "acme", "cents": 4_200}, workflow_id="wf-c03")
ALICE = {"Authorization": "Basic " + base64.b64encode(b"alice:alice-pw").decode()}


@pytest.mark.parametrize(
    ("login", "why"),
    [
        ("approver", "nobody is recorded as having asked"),
        ("worker", "not an approver"),
    ],
)
async def test_a_database_refusal_is_a_403_page(login: str, why: str) -> None:
    async with role_world(separate_duty=True) as world:
        worker = build_ledger(await world.store("worker"))
        with pytest.raises(ApprovalPendingError):
            await worker.run(
                PAY, lambda e: 1, RunOptions(requires_approval=True, wait_for_approval=False)
            )
        key = worker.idem_key(PAY)
        if login == "approver":
            # run() recorded the request; a request lost (a process dying between
            # its two statements) leaves none, which the database refuses to decide.
            async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
                await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE idem_key = %s").format(
                        sql.Identifier(world.schema, "agent_ledger_approvals")
                    ),
                    (key,),
                )
        app = create_app(
            await world.store(login),
            authenticate=StaticUsers({"alice": hash_password("alice-pw")}),
            authorize=ToolPatterns({"alice": ["pay"]}),
            secret=b"s" * 32,
        )
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as client:
            page = await client.get(f"/effects/{key}", headers=ALICE)
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
            intent = re.search(r'name="intent" value="([0-9a-f]+)"', page.text)
            assert csrf is not None and intent is not None
            posted = await client.post(
                f"/effects/{key}/decide",
                headers={**ALICE, "Origin": ORIGIN},
                data={"csrf": csrf.group(1), "intent": intent.group(1), "action": "approve"},
            )
        assert posted.status_code == 403
        assert "Refused" in posted.text and why in posted.text
        effect = await world.admin.find(key)
        assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
