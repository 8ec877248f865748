"""The five-part story under the OpenAI Agents SDK: a real ``Runner``, the SDK's own
``ScriptedModel``, a ledger on SQLite.

(1) duplicate tool calls run the side effect once; (2) a fresh ledger and agent on the
same store (a restarted process) resume without repeating it; (3) approval through the
SDK's own human-in-the-loop (``state.approve``) is recorded with who decided, and the
tool runs once; (4) ``state.reject`` tells the model and denies the ledger effect; (5)
the same arguments in a later turn (a new run input) run again, while a repeat within
the turn is answered from the receipt. Plus: a retryable failure runs again, a budget
refusal reaches the application as ``BudgetExceededError``, and model calls go through
the ledger (``LedgerModel``): refused before the model is called, replayed without it.
One slow test kills a real process after the side effect and resumes in another.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, RunResult, ToolCallOutputItem, Usage, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from agent_ledger import (
    Budget,
    BudgetExceededError,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    MemoryStore,
    SqliteStore,
)
from agent_ledger.adapters.openai_agents import (
    RUN_STATE,
    LedgerModel,
    as_function_tools,
)
from agent_ledger.effects import Usage as LedgerUsage

set_tracing_disabled(True)


class Shop:
    """A ledger on SQLite with the shop's tools, and what each really did."""

    def __init__(self, path: Path | None) -> None:
        store = MemoryStore() if path is None else SqliteStore(str(path))
        self.ledger = EffectLedger(EffectLedgerOptions(store=store))
        self.sent: list[str] = []
        self.refunds: list[str] = []
        self.flaky_tries = 0
        ledger = self.ledger

        @ledger.tool("mail.send", idempotency_keys=["to", "text"])
        async def send(to: str, text: str) -> str:
            """Send an email."""
            self.sent.append(to)
            return f"sent to {to}"

        @ledger.tool("payments.refund", requires_approval=True)
        async def refund(order_id: str) -> str:
            """Refund an order (a person approves)."""
            self.refunds.append(order_id)
            return f"refunded {order_id}"

        @ledger.tool("crm.sync", retryable=(ConnectionError,))
        async def sync(account: str) -> str:
            """Sync an account; the CRM drops connections now and then."""
            self.flaky_tries += 1
            if self.flaky_tries == 1:
                raise ConnectionError("the CRM hung up")
            return f"synced {account}"

    def agent(self, model: Any) -> Agent[Any]:
        return Agent(name="shop", model=model, tools=as_function_tools(self.ledger))

    async def effects(self, tool: str) -> list[Any]:
        return (await self.ledger.list_effects(workflow_id="thread-1", tool=tool)).effects


def outputs(result: RunResult) -> dict[str, str]:
    return {
        str(item.call_id): str(item.output)
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem)
    }


def send(call_id: str, to: str = "ada@example.com") -> Any:
    return function_call("mail_send", {"to": to, "text": "reminder"}, call_id=call_id)


async def test_duplicates_run_once_and_a_restarted_process_does_not_repeat(
    tmp_path: Path,
) -> None:
    """(1) and (2): two identical calls in one turn send once; a fresh ledger and agent
    on the same file, given the same input (the same turn), replay instead of sending."""
    path = tmp_path / "ledger.db"
    shop = Shop(path)
    model = ScriptedModel([[send("c1"), send("c2")], [assistant_message("reminded")]])
    async with shop.ledger.workflow("thread-1"):
        first = await Runner.run(shop.agent(model), "remind Ada")
    assert shop.sent == ["ada@example.com"]
    assert outputs(first) == {"c1": "sent to ada@example.com", "c2": "sent to ada@example.com"}
    await shop.ledger.store.close()

    restarted = Shop(path)  # the process died after the email went out
    model = ScriptedModel([[send("c9")], [assistant_message("reminded")]])
    async with restarted.ledger.workflow("thread-1"):
        again = await Runner.run(restarted.agent(model), "remind Ada")
    assert restarted.sent == [] and list(outputs(again)) == ["c9"]
    # Answered from the receipt the dead process's run made: the model reads so.
    assert outputs(again)["c9"].startswith("Already done at ")
    assert ", in an earlier run (receipt " in outputs(again)["c9"]
    assert outputs(again)["c9"].endswith("Its result then: sent to ada@example.com")
    (effect,) = await restarted.effects("mail.send")
    assert effect.status is EffectStatus.SUCCEEDED and effect.executions == 1
    await restarted.ledger.store.close()


async def test_approve_and_reject_through_the_sdks_own_human_in_the_loop(
    tmp_path: Path,
) -> None:
    """(3) state.approve: the ledger records the decision (decided_by) and the refund runs
    once; (4) state.reject: the model is told, and the ledger effect is denied."""
    shop = Shop(tmp_path / "ledger.db")
    refund = function_call("payments_refund", {"order_id": "o1"}, call_id="r1")
    other = function_call("payments_refund", {"order_id": "o2"}, call_id="r2")
    model = ScriptedModel([[refund, other], [assistant_message("one refunded")]])
    agent = shop.agent(model)
    async with shop.ledger.workflow("thread-1"):
        paused = await Runner.run(agent, "refund o1 and o2")
        assert [i.call_id for i in paused.interruptions] == ["r1", "r2"]
        assert len(await shop.ledger.pending_approvals()) == 2
        state = paused.to_state()
        state.approve(paused.interruptions[0])
        state.reject(paused.interruptions[1], rejection_message="o2 was never paid")
        resumed = await Runner.run(agent, state)
        assert await shop.ledger.pending_approvals() == []
    assert shop.refunds == ["o1"] and resumed.final_output == "one refunded"
    answers = outputs(resumed)
    assert answers["r1"] == "refunded o1" and answers["r2"] == "o2 was never paid"
    by_order = {e.args["order_id"]: e for e in await shop.effects("payments.refund")}
    assert by_order["o1"].status is EffectStatus.SUCCEEDED
    assert by_order["o1"].decided_by == RUN_STATE and by_order["o1"].executions == 1
    assert by_order["o2"].status is EffectStatus.DENIED
    assert by_order["o2"].decided_by == RUN_STATE
    assert by_order["o2"].error is not None and by_order["o2"].error.message == (
        "o2 was never paid"
    )
    await shop.ledger.store.close()


async def test_a_later_turn_runs_again_a_repeat_within_the_turn_does_not(
    tmp_path: Path,
) -> None:
    """(5) scope="turn" by default, the turn being the run's input: "remind Ada" asked
    again in a later turn sends again; the model repeating itself in a turn does not."""
    shop = Shop(tmp_path / "ledger.db")
    first = ScriptedModel([[send("a1")], [send("a2")], [assistant_message("sent")]])
    async with shop.ledger.workflow("thread-1"):
        turn1 = await Runner.run(shop.agent(first), "remind Ada")
        history: list[Any] = [
            *turn1.to_input_list(),
            {"role": "user", "content": "remind Ada again"},
        ]
        second = ScriptedModel([[send("b1")], [assistant_message("sent again")]])
        turn2 = await Runner.run(shop.agent(second), history)
    assert shop.sent == ["ada@example.com", "ada@example.com"]
    assert outputs(turn1)["a2"] == outputs(turn1)["a1"] == "sent to ada@example.com"
    assert outputs(turn2)["b1"] == "sent to ada@example.com"
    effects = await shop.effects("mail.send")
    assert len(effects) == 2 and len({e.turn for e in effects}) == 2

    # A tool keyed once per workflow says it was done in an earlier turn, and when.
    ledger = shop.ledger

    @ledger.tool("mail.welcome", scope="workflow")
    async def welcome(to: str) -> str:
        shop.sent.append(f"welcome {to}")
        return "welcomed"

    hello = ScriptedModel(
        [[function_call("mail_welcome", {"to": "ada"}, call_id="w")], [assistant_message("")]]
    )
    again = ScriptedModel(
        [[function_call("mail_welcome", {"to": "ada"}, call_id="v")], [assistant_message("")]]
    )
    async with ledger.workflow("thread-1"):
        await Runner.run(shop.agent(hello), "welcome Ada")
        later = await Runner.run(shop.agent(again), "welcome Ada, please")
    assert shop.sent.count("welcome ada") == 1
    told = outputs(later)["v"]
    assert told.startswith("Already done at ") and "in an earlier turn (receipt " in told
    assert told.endswith("Its result then: welcomed")
    await shop.ledger.store.close()


async def test_a_retryable_failure_runs_again(tmp_path: Path) -> None:
    """The tool declared ConnectionError retryable: the model reads that it may retry,
    retries in the same turn, and the call runs again (the failure stays in history)."""
    shop = Shop(tmp_path / "ledger.db")
    sync = {"account": "acme"}
    model = ScriptedModel(
        [
            [function_call("crm_sync", sync, call_id="s1")],
            [function_call("crm_sync", sync, call_id="s2")],
            [assistant_message("synced")],
        ]
    )
    async with shop.ledger.workflow("thread-1"):
        result = await Runner.run(shop.agent(model), "sync acme")
    answers = outputs(result)
    assert answers["s1"].startswith("This call failed and may be retried")
    assert "the CRM hung up" in answers["s1"]
    assert answers["s2"] == "synced acme" and shop.flaky_tries == 2
    (effect,) = await shop.effects("crm.sync")
    assert effect.status is EffectStatus.SUCCEEDED
    await shop.ledger.store.close()


async def test_a_budget_refusal_reaches_the_application(tmp_path: Path) -> None:
    """Not "please try again": Runner.run raises BudgetExceededError; nothing more ran."""
    shop = Shop(tmp_path / "ledger.db")
    model = ScriptedModel(
        [[send("c1")], [send("c2", to="bob@example.com")], [assistant_message("unreachable")]]
    )
    async with shop.ledger.workflow("thread-1", budget=Budget(tool_calls=1)):
        with pytest.raises(BudgetExceededError) as refused:
            await Runner.run(shop.agent(model), "remind Ada and Bob")
    assert refused.value.units == ("tool_calls",)
    assert shop.sent == ["ada@example.com"]
    await shop.ledger.store.close()


def price(provider: str, model: str, usage: LedgerUsage) -> float:
    return (usage.input_tokens + usage.output_tokens) / 1000  # $1 per thousand tokens


async def test_model_calls_are_recorded_refused_by_the_budget_and_replayed(
    tmp_path: Path,
) -> None:
    """LedgerModel: each model call is an effect with usage and price; a dollar budget
    refuses the call before the model is asked; a replay serves the recorded run without
    calling the model or the tool."""
    shop = Shop(tmp_path / "ledger.db")
    usage = Usage(requests=1, input_tokens=4, output_tokens=2, total_tokens=6)
    script = [[send("c1")], [assistant_message("reminded")]]
    model = ScriptedModel(script, default_usage=usage)
    recorded = LedgerModel(model, shop.ledger, name="gpt-test", pricing=price)
    async with shop.ledger.workflow("thread-1"):
        result = await Runner.run(shop.agent(recorded), "remind Ada")
    assert result.final_output == "reminded" and len(model.calls) == 2
    calls = (await shop.ledger.list_effects(workflow_id="thread-1", tool="llm.openai")).effects
    assert len(calls) == 2
    assert all(c.usage is not None and c.usage.cost_usd == pytest.approx(0.006) for c in calls)

    # A dollar budget: the third model call does not fit, and the model is not asked.
    capped = ScriptedModel(
        [[send("d1", to="bob@example.com")], [send("d2", to="cy@example.com")], script[1]],
        default_usage=usage,
    )
    async with shop.ledger.workflow("capped", budget=Budget(usd=0.013)):
        with pytest.raises(BudgetExceededError) as refused:
            await Runner.run(
                shop.agent(
                    LedgerModel(
                        capped,
                        shop.ledger,
                        name="gpt-test",
                        pricing=price,
                        estimate=LedgerUsage(input_tokens=4, output_tokens=2),
                    )
                ),
                "remind Bob and Cy",
            )
    assert "usd" in refused.value.units and len(capped.calls) == 2

    # Replay the first run from its store: answered from the receipts.
    replayer = Shop(None)  # the same agent, on a ledger of its own
    silent = ScriptedModel([])  # asked nothing: every reply comes from the recording
    agent = replayer.agent(LedgerModel(silent, replayer.ledger, name="gpt-test", pricing=price))
    async with replayer.ledger.replay("thread-1", source=shop.ledger.store):
        again = await Runner.run(agent, "remind Ada")
    assert again.final_output == "reminded" and silent.calls == ()
    assert replayer.sent == [] and outputs(again) == {"c1": "sent to ada@example.com"}
    await shop.ledger.store.close()


CHILD = """
import asyncio, os, sys
from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from agent_ledger import EffectLedger, EffectLedgerOptions, SqliteStore
from agent_ledger.adapters.openai_agents import as_function_tools

set_tracing_disabled(True)
db, outbox, die = sys.argv[1], sys.argv[2], sys.argv[3] == "die"
ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(db)))


@ledger.tool("mail.send", idempotency_keys=["to"])
async def send(to: str, text: str) -> str:
    with open(outbox, "a") as f:
        f.write(to + "\\n")  # the side effect
    return f"sent to {to}"


def after_the_tool(call):
    if die:
        os.kill(os.getpid(), 9)  # the process dies once the email went out
    return [assistant_message("reminded")]


call = function_call("mail_send", {"to": "ada", "text": "hi"}, call_id="c1")
model = ScriptedModel([[call], {"responder": after_the_tool}])
agent = Agent(name="shop", model=model, tools=as_function_tools(ledger))


async def main():
    async with ledger.workflow("thread-1"):
        result = await Runner.run(agent, "remind Ada")
    print(result.final_output)


asyncio.run(main())
"""


@pytest.mark.slow
def test_a_killed_process_resumed_by_a_new_one_does_not_repeat(tmp_path: Path) -> None:
    """(2) with a real kill: the process is SIGKILLed after the email went out; a new
    process runs the same request and the email is not sent again."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db, outbox = tmp_path / "ledger.db", tmp_path / "outbox.txt"
    killed = subprocess.run(
        [sys.executable, str(script), str(db), str(outbox), "die"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    assert outbox.read_text() == "ada\n"
    resumed = subprocess.run(
        [sys.executable, str(script), str(db), str(outbox), "live"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "reminded"
    assert outbox.read_text() == "ada\n"  # not sent twice
