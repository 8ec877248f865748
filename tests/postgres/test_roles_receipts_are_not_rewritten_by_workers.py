"""A decided effect's receipt is the approver's, not the worker's (issue 28, R03).

Once a person decided, the worker may not rewrite why (the decision note),
why a denial was refused (its error), or what happened (the history: only
appends). The hot path (commits of a processing row) is not checked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.testing import build_ledger
from tests.postgres.roles_world import RoleWorld, role_world

GATED = RunOptions(requires_approval=True, wait_for_approval=False)
OK = ToolCall(workflow_id="wf-receipt", tool="payments.send", args={"to": "acme", "cents": 100})
NO = ToolCall(workflow_id="wf-receipt", tool="payments.send", args={"to": "mallory", "cents": 9})


@pytest.fixture
async def world() -> AsyncIterator[RoleWorld]:
    async with role_world() as made:
        yield made


async def test_the_worker_cannot_rewrite_a_decided_receipt(world: RoleWorld) -> None:
    worker = build_ledger(await world.store("worker"))
    approver = build_ledger(await world.store("approver"))
    for call in (OK, NO):
        with pytest.raises(ApprovalPendingError):
            await worker.run(call, lambda e: {"paid": 1}, GATED)
    ok, no = worker.idem_key(OK), worker.idem_key(NO)
    assert await approver.approve(ok, note="acme only")
    assert await approver.deny(no, reason="mallory is not a vendor")
    # The approved one runs (a claim and a commit append to its history).
    assert await worker.run(OK, lambda e: {"paid": 100}, GATED) == {"paid": 100}
    effects = sql.Identifier(world.schema, "agent_ledger_effects")
    before = {key: await world.admin.find(key) for key in (ok, no)}
    forgeries = [
        (ok, "decision_note = 'any amount'"),
        (ok, "history = history - 0"),
        (ok, "history = jsonb_set(history, '{0,by}', '\"dave\"')"),
        (ok, "history = '[]'"),
        (no, "decision_note = 'typo, retry'"),
        (no, 'error = \'{"message": "by accident", "code": "denied"}\''),
    ]
    async with await psycopg.AsyncConnection.connect(world.dsn("worker"), autocommit=True) as conn:
        for key, assignment in forgeries:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                await conn.execute(
                    sql.SQL(
                        "UPDATE {} SET "
                        + assignment.replace("{", "{{").replace("}", "}}")
                        + " WHERE idem_key = %s"
                    ).format(effects),
                    (key,),
                )
            assert refused.value.diag.constraint_name == "not_an_approver", assignment
    for key, effect in before.items():
        assert await world.admin.find(key) == effect
    done = before[ok]
    assert done is not None and done.status is EffectStatus.SUCCEEDED
    assert done.decision_note == "acme only"


async def test_the_workers_cancel_and_an_approvers_note_still_work(world: RoleWorld) -> None:
    worker = build_ledger(await world.store("worker"))
    with pytest.raises(ApprovalPendingError):
        await worker.run(OK, lambda e: {"paid": 1}, GATED)
    key = worker.idem_key(OK)
    effects = sql.Identifier(world.schema, "agent_ledger_effects")
    # The worker cancels (one of its own edges, with a reason).
    assert await worker.cancel(key, by="ops", reason="not needed")
    cancelled = await world.admin.find(key)
    assert cancelled is not None and cancelled.status is EffectStatus.CANCELED
    # An approver may still correct a note.
    async with await psycopg.AsyncConnection.connect(
        world.dsn("approver"), autocommit=True
    ) as conn:
        await conn.execute(
            sql.SQL("UPDATE {} SET decision_note = 'no longer needed' WHERE idem_key = %s").format(
                effects
            ),
            (key,),
        )
    corrected = await world.admin.find(key)
    assert corrected is not None and corrected.decision_note == "no longer needed"
