"""The worker may make only the partitions a begin needs (issue 28, R06).

Under the role set, agent_ledger_add_partitions runs as the owner (SECURITY
DEFINER) so that a worker's begin can make the current period's partition.
Nobody else may execute it (PUBLIC's EXECUTE is revoked), and a caller that
is not a member of the owner role gets partitions only from the previous
period to `ahead` periods on: not years of tables, not the past.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from agent_ledger import ToolCall
from agent_ledger.testing import build_ledger
from tests.postgres.roles_world import RoleWorld, role_world


async def _partitions(world: RoleWorld) -> int:
    ((count,),) = await world.sql(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass",
        f'"{world.schema}".agent_ledger_effects',
    )
    assert isinstance(count, int)
    return count


async def _call(world: RoleWorld, who: str, query: str) -> object:
    async with await psycopg.AsyncConnection.connect(world.dsn(who), autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(world.schema)))
        cursor = await conn.execute(query.encode())
        return (await cursor.fetchone() or (None,))[0]


async def test_a_worker_cannot_make_partitions_far_ahead_or_in_the_past() -> None:
    async with role_world(partitioned=True) as world:
        before = await _partitions(world)
        for bounds in (
            "clock_timestamp() + interval '10 years', NULL",
            "clock_timestamp(), clock_timestamp() - interval '3 years'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await _call(world, "worker", f"SELECT agent_ledger_add_partitions({bounds})")
        assert await _partitions(world) == before
        # What a begin asks for (the current period) and the default (`ahead` on) work.
        assert (
            await _call(world, "worker", "SELECT agent_ledger_add_partitions(clock_timestamp())")
            == 0
        )
        assert await _call(world, "worker", "SELECT agent_ledger_add_partitions()") == 0
        # A worker's run still works end to end.
        worker = build_ledger(await world.store("worker"))
        assert await worker.run(ToolCall(workflow_id="wf", tool="t", args={}), lambda e: 1) == 1
        # The owner still may make what it likes.
        made = await _call(
            world,
            "owner",
            "SELECT agent_ledger_add_partitions(clock_timestamp() + interval '1 year')",
        )
        assert isinstance(made, int) and made > 0
        assert await _partitions(world) == before + made


async def test_the_approver_may_not_execute_it() -> None:
    async with role_world(partitioned=True) as world:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            await _call(world, "approver", "SELECT agent_ledger_add_partitions(clock_timestamp())")
        assert "permission denied for function" in str(refused.value)
