"""Two workers (two pools) reserving for the same call at once (issue 13, second pass).

Before: BUDGET_RESERVE read the effect's holds from its statement's
snapshot, taken before it waited for the budget row, so the other worker's
hold (inserted meanwhile) was invisible to it: the second caller of an
in-flight call was refused when the limit had room for that call only, and
with more room the effect held it twice.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_ledger import Budget
from agent_ledger.budgets import Spend
from agent_ledger.stores.budget_base import NewHold
from agent_ledger.stores.postgres import PostgresStore

USD = frozenset({"usd_micros"})
ROUNDS = 30


async def test_two_workers_reserving_for_one_call_share_one_room(
    pg: Any, dsn: str, schema: str
) -> None:
    one = await PostgresStore.connect(dsn, schema=schema, min_size=2, max_size=2)
    two = await PostgresStore.connect(dsn, schema=schema, min_size=2, max_size=2)
    try:
        for limit in (1.0, 2.0):
            for n in range(ROUNDS):
                workflow = f"race-{limit}-{n}"
                await one.open_budget(workflow, Budget(usd=limit))
                holds = [
                    NewHold(f"{workflow}-{i}", workflow, "k", Spend(1_000_000), USD, 60_000)
                    for i in range(2)
                ]
                got = await asyncio.gather(
                    one.reserve_budget(holds[0]), two.reserve_budget(holds[1])
                )
                assert list(got) == [True, True], (limit, n)  # the second caller is never refused
                state = await one.get_budget(workflow)
                assert state is not None, workflow
                assert state.reserved.usd_micros == 1_000_000, (limit, n)  # held once
                assert state.holds == 1
                # A run that finished after both holds were made releases them both.
                assert await two.book_charge(
                    workflow,
                    idem_key="k",
                    charge=Spend(1_000_000),
                    hold_id=None,
                    finished_at=datetime.now(UTC) + timedelta(minutes=1),
                )
                state = await one.get_budget(workflow)
                assert state is not None and state.reserved == Spend() and state.holds == 0
                assert state.spent.usd_micros == 1_000_000
    finally:
        await one.close()
        await two.close()
