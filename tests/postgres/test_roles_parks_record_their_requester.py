"""A park is a request like any other: its asker is recorded (issue 28, R04).

With separation of duty on, a login that is both worker and approver must not
approve its own effect by making it look like a parked attempt (which nobody
asked for). Whenever an effect enters requires_approval under the role set
(a park, an approval taken back, an effect inserted as a park), the database
records the session as the new round's requester, and the round's deadline
and escalation start empty.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.errors import EffectLedgerPermissionError
from agent_ledger.keys import canonical_json
from agent_ledger.testing import build_ledger
from tests.postgres.roles_world import RoleWorld, role_world

PARK = '{"message": "worker went silent", "code": "ambiguous_attempt"}'


async def _as(world: RoleWorld, who: str, query: sql.Composed, *params: object) -> None:
    async with await psycopg.AsyncConnection.connect(world.dsn(who), autocommit=True) as conn:
        await conn.execute(query, list(params))


async def test_a_login_cannot_approve_the_effect_it_parked_itself() -> None:
    async with role_world(separate_duty=True) as world:
        effects = sql.Identifier(world.schema, "agent_ledger_effects")
        both = build_ledger(await world.store("both"))
        parked_by_update = ToolCall(workflow_id="wf-park", tool="payments.send", args={"n": 1})
        inserted_parked = ToolCall(workflow_id="wf-park", tool="payments.send", args={"n": 2})
        columns = "(idem_key, workflow_id, tool, args_canonical, status, error)"
        for call, status in (
            (parked_by_update, "processing"),
            (inserted_parked, "requires_approval"),
        ):
            await _as(
                world,
                "both",
                sql.SQL("INSERT INTO {} " + columns + " VALUES (%s, %s, %s, %s, %s, %s)").format(
                    effects
                ),
                both.idem_key(call),
                call.workflow_id,
                call.tool,
                canonical_json(call.args, field="args").decode(),
                status,
                PARK if status == "requires_approval" else None,
            )
        await _as(
            world,
            "both",
            sql.SQL(
                "UPDATE {} SET status = 'requires_approval', error = %s WHERE idem_key = %s"
            ).format(effects),
            PARK,
            both.idem_key(parked_by_update),
        )
        for call in (parked_by_update, inserted_parked):
            key = both.idem_key(call)
            request = await world.admin.approval_request(key)
            assert request is not None and request.requested_by == world.logins["both"]
            with pytest.raises(EffectLedgerPermissionError) as refused:
                await both.approve(key, by="someone-else")
            assert refused.value.code == "self_decision"
            effect = await world.admin.find(key)
            assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
            # Another approver decides it.
            approver = build_ledger(await world.store("approver"))
            assert await approver.approve(key)


async def test_taking_an_approval_back_starts_a_new_round_asked_by_the_session() -> None:
    async with role_world(separate_duty=True) as world:
        worker = build_ledger(await world.store("worker"))
        store = await world.store("worker")
        call = ToolCall(workflow_id="wf-round", tool="payments.send", args={"n": 3})
        gated = RunOptions(requires_approval=True, wait_for_approval=False)
        with pytest.raises(ApprovalPendingError):
            await worker.run(call, lambda e: 1, gated)
        key = worker.idem_key(call)
        await store.note_request(key, requested_by=None, policy_version="p1", deadline_ms=60_000)
        approver_store = await world.store("approver")
        approver = build_ledger(approver_store)
        assert await approver.approve(key)
        # The approver takes it back: a new round, asked by the approver's login.
        assert await approver.request_approval(key)
        request = await world.admin.approval_request(key)
        assert request is not None
        assert request.requested_by == world.logins["approver"]
        assert (request.deadline_at, request.policy_version, request.escalated_at) == (
            None,
            None,
            None,
        )
        # So the approver may not approve its own new request; the worker still may not deny it.
        with pytest.raises(EffectLedgerPermissionError) as refused:
            await approver.approve(key)
        assert refused.value.code == "self_decision"
        with pytest.raises(EffectLedgerPermissionError):
            await worker.deny(key, reason="expired?")
