"""Under the role set, a worker's pre-inserted row never runs a gated call unapproved (R01).

The worker may insert an effect as processing and move its own processing
rows to ready (a release); it may not write a decision on any edge but a
cancel. So an honest ``run(requires_approval=True)`` that finds the key
stale or ready without a decision sends it to a person instead of running it.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.keys import canonical_json
from agent_ledger.options import StaleOptions
from agent_ledger.testing import build_ledger
from tests.postgres.roles_world import RoleWorld, role_world

GATED = RunOptions(
    requires_approval=True, wait_for_approval=False, stale=StaleOptions(after_ms=1_000)
)


async def _pre_insert(world: RoleWorld, call: ToolCall, key: str) -> None:
    effects = sql.Identifier(world.schema, "agent_ledger_effects")
    async with await psycopg.AsyncConnection.connect(world.dsn("worker"), autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (idem_key, workflow_id, tool, status, args_canonical,"
                " heartbeat_at, lease_ms) VALUES (%s, %s, %s, 'processing', %s,"
                " clock_timestamp() - interval '1 hour', 1)"
            ).format(effects),
            (key, call.workflow_id, call.tool, canonical_json(call.args, field="args").decode()),
        )


async def test_a_workers_stale_or_released_row_is_sent_for_approval() -> None:
    async with role_world() as world:
        honest = build_ledger(await world.store("worker"))
        approver = build_ledger(await world.store("approver"))
        effects = sql.Identifier(world.schema, "agent_ledger_effects")
        ran: list[int] = []

        def pay(effect: object) -> str:
            ran.append(1)
            return "paid"

        for n, release in enumerate((False, True)):
            call = ToolCall(workflow_id="wf-r01", tool="payments.send", args={"n": n})
            key = honest.idem_key(call)
            await _pre_insert(world, call, key)
            async with await psycopg.AsyncConnection.connect(
                world.dsn("worker"), autocommit=True
            ) as conn:
                # A forged decision on the release edge is refused (either column)...
                for forged in ("decided_at = clock_timestamp()", "decided_by = 'alice'"):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        await conn.execute(
                            sql.SQL("UPDATE {} SET status = 'ready', " + forged).format(effects)
                            + sql.SQL(" WHERE idem_key = %s"),
                            (key,),
                        )
                if release:  # ... a plain release is the worker's own edge.
                    await conn.execute(
                        sql.SQL("UPDATE {} SET status = 'ready' WHERE idem_key = %s").format(
                            effects
                        ),
                        (key,),
                    )
            ran.clear()
            with pytest.raises(ApprovalPendingError):
                await honest.run(call, pay, GATED)
            assert ran == []
            waiting = await world.admin.find(key)
            assert waiting is not None and waiting.status is EffectStatus.REQUIRES_APPROVAL
            assert await approver.approve(key)
            assert await honest.run(call, pay, GATED) == "paid"
            assert ran == [1]
