"""Separation of duty holds whatever role the asker's session sets (issue 28, R05).

A common role design grants people a team role that is granted the approver
role. A person who asked for an approval (the requester is stamped with the
login) must not approve it by running SET ROLE to that team role: the
database compares the requester with the session's login and its current
role, case-insensitively, as the application compares principals.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.testing import build_ledger
from tests.postgres.roles_world import role_world

GATED = RunOptions(requires_approval=True, wait_for_approval=False)
PAY = ToolCall(workflow_id="wf-set-role", tool="payments.send", args={"to": "me", "cents": 50_000})


async def test_a_requester_that_sets_a_team_role_still_may_not_decide() -> None:
    async with role_world(separate_duty=True) as world:
        team = f"Team_{uuid.uuid4().hex[:8]}"
        person = world.logins["worker"]
        await world.sql(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(team)))
        try:
            await world.sql(
                sql.SQL("GRANT {} TO {}").format(
                    sql.Identifier(world.roles.approver), sql.Identifier(team)
                )
            )
            await world.sql(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(team), sql.Identifier(person))
            )
            store = await world.store("worker")
            ledger = build_ledger(store)
            with pytest.raises(ApprovalPendingError):
                await ledger.run(PAY, lambda e: {"paid": 1}, GATED)
            key = ledger.idem_key(PAY)
            request = await store.note_request(
                key, requested_by=None, policy_version=None, deadline_ms=None
            )
            assert request.requested_by == person
            approve = sql.SQL(
                "UPDATE {} SET status = 'ready', decided_by = 'x', decided_at = clock_timestamp()"
                " WHERE idem_key = %s"
            ).format(sql.Identifier(world.schema, "agent_ledger_effects"))
            async with await psycopg.AsyncConnection.connect(
                world.dsn("worker"), autocommit=True
            ) as conn:
                # As itself, and through the team role: refused both ways.
                for role in (None, team):
                    if role is not None:
                        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
                    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                        await conn.execute(approve, (key,))
                    assert refused.value.diag.constraint_name == "self_decision"
            effect = await world.admin.find(key)
            assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
            assert effect.decided_by is None
            # Another approver still decides it.
            approver = build_ledger(await world.store("approver"))
            assert await approver.approve(key)
        finally:
            await world.sql(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(team)))
            await world.sql(sql.SQL("DROP ROLE {}").format(sql.Identifier(team)))
