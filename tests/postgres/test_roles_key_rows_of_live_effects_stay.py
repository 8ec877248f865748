"""On the partitioned table a worker cannot free the key of a live effect (issue 28, R02).

A key row in agent_ledger_effect_keys is what makes a second begin of the
same call meet the first effect. A worker that deleted the key row of an
effect waiting for approval could begin the call again beside it and run it
unapproved; so only the owner (a purge) deletes the key row of an effect that
exists, and a worker's begin still reclaims a key whose effect is gone.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.testing import build_ledger
from tests.postgres.roles_world import role_world

GATED = RunOptions(requires_approval=True, wait_for_approval=False)
PAY = ToolCall(workflow_id="wf-keys", tool="payments.send", args={"to": "acme", "cents": 7})


async def test_a_worker_cannot_delete_the_key_of_a_waiting_effect() -> None:
    async with role_world(partitioned=True) as world:
        worker = build_ledger(await world.store("worker"))
        with pytest.raises(ApprovalPendingError):
            await worker.run(PAY, lambda e: {"paid": 1}, GATED)
        key = worker.idem_key(PAY)
        keys = sql.Identifier(world.schema, "agent_ledger_effect_keys")
        async with await psycopg.AsyncConnection.connect(
            world.dsn("worker"), autocommit=True
        ) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE idem_key = %s").format(keys), (key,)
                )
            assert refused.value.diag.constraint_name == "not_the_owner"
        assert await world.sql(sql.SQL("SELECT count(*) FROM {}").format(keys)) == [(1,)]
        ran: list[int] = []
        with pytest.raises(ApprovalPendingError):
            await worker.run(PAY, lambda e: ran.append(1), GATED)
        assert ran == []
        effect = await world.admin.find(key)
        assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL


async def test_a_worker_still_reclaims_a_key_whose_effect_is_gone() -> None:
    async with role_world(partitioned=True) as world:
        worker = build_ledger(await world.store("worker"))
        call = ToolCall(workflow_id="wf-keys", tool="t", args={})
        assert await worker.run(call, lambda e: "first") == "first"
        effects = sql.Identifier(world.schema, "agent_ledger_effects")
        # As a purge's detached partition leaves it: the key row without its effect.
        await world.sql(
            sql.SQL("DELETE FROM {} WHERE idem_key = %s").format(effects), worker.idem_key(call)
        )
        fresh = build_ledger(await world.store("worker"))
        assert await fresh.run(call, lambda e: "again") == "again"
