"""`agent-ledger budget show W` and the spend in `stats`, through the real console
script, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from agent_ledger import Budget, BudgetExceededError, LLMResult, Usage, open_store
from agent_ledger.testing import build_ledger
from tests.cli.conftest import Cli


async def _spend(url: str) -> None:
    """Two model calls of $0.30 on a $0.70 budget (the third is refused), one tool call."""
    store = await open_store(url, create=True)
    try:
        ledger = build_ledger(store)

        @ledger.tool("mail.send")
        async def send(to: str) -> str:
            return to

        async with ledger.workflow("agent-7", budget=Budget(usd=0.7, tool_calls=5)):
            for n in range(3):
                call = ledger.llm(
                    lambda request: LLMResult({"ok": True}, Usage(1000, 500)),
                    provider="fake",
                    model="m1",
                    request={"n": n},
                    pricing=lambda provider, model, usage: 0.30,
                    estimate=Usage(1000, 500),
                )
                if n < 2:
                    await call
                else:
                    with pytest.raises(BudgetExceededError):
                        await call
            await send("ana")
    finally:
        await store.close()


def test_budget_show_and_stats_report_spend(cli: Cli) -> None:
    assert cli("init").returncode == 0
    asyncio.run(_spend(cli.url))
    shown = cli("budget", "show", "agent-7")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("budget of workflow agent-7 (0 open holds")
    usd = next(line.split() for line in lines if line.strip().startswith("usd"))
    assert usd == ["usd", "$0.700000", "$0.600000", "$0.000000", "$0.100000"]
    calls = next(line.split() for line in lines if line.strip().startswith("tool_calls"))
    assert calls == ["tool_calls", "5", "1", "0", "4"]
    record = orjson.loads(cli("budget", "show", "agent-7", "--json").stdout)
    assert record["spent"] == {
        "usd": 0.6,
        "input_tokens": 2000,
        "output_tokens": 1000,
        "tool_calls": 1,
    }
    assert record["limits"]["usd"] == 0.7 and record["limits"]["input_tokens"] is None
    assert record["remaining"]["usd"] == 0.1 and record["open_holds"] == 0
    stats = cli("stats")
    assert stats.returncode == 0
    assert "spend by workflow" in stats.stdout
    line = next(x for x in stats.stdout.splitlines() if x.strip().startswith("agent-7"))
    assert "$0.600000 of $0.700000" in line and "1 tool call" in line
    as_json = orjson.loads(cli("stats", "--json").stdout)
    assert [b["workflow_id"] for b in as_json["budgets"]] == ["agent-7"]
    missing = cli("budget", "show", "nobody")
    assert missing.returncode == 1 and "no budget is stored" in missing.stderr
