"""Agents SDK: a handoff that rewrites the next agent's input does not start another turn.

``RunConfig(nest_handoff_history=True)`` collapses the transcript into one assistant
message, and ``handoff(input_filter=handoff_filters.remove_all_tools)`` drops the tool
items of earlier turns: both change ``turn_input`` mid-run. Agent A sends to ada and
hands off to B, which sends the same reminder again within the same ``Runner.run`` (one
user request): it must be answered from the receipt, not sent twice. The next request,
a new ``Runner.run``, is a new turn and sends again. The real ``Runner`` and the SDK's
own ``ScriptedModel``.
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, Usage, handoff, set_tracing_disabled
from agents.extensions import handoff_filters
from agents.testing import ScriptedModel, assistant_message, function_call

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
from agent_ledger.adapters.openai_agents import as_function_tools

set_tracing_disabled(True)
USAGE = Usage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2)


def _agents(ledger: EffectLedger, variant: str) -> Agent[Any]:
    tools = as_function_tools(ledger)
    b = Agent(
        name="b",
        model=ScriptedModel(
            [
                [function_call("mail_send", {"to": "ada"}, call_id="b1")],
                [assistant_message("b done")],
            ],
            default_usage=USAGE,
        ),
        tools=tools,
    )
    to_b: Any = (
        handoff(b, input_filter=handoff_filters.remove_all_tools)
        if variant == "remove_all_tools"
        else b
    )
    return Agent(
        name="a",
        model=ScriptedModel(
            [
                [function_call("crm_lookup", {"who": "bo"}, call_id="a0")],
                [assistant_message("bo ok")],
                [function_call("mail_send", {"to": "ada"}, call_id="a1")],
                [function_call("transfer_to_b", {}, call_id="h1")],
            ],
            default_usage=USAGE,
        ),
        tools=tools,
        handoffs=[to_b],
    )


@pytest.mark.parametrize("variant", ["plain", "nest_handoff_history", "remove_all_tools"])
async def test_a_handoff_rewriting_the_input_keeps_the_runs_turn(variant: str) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    sent: list[str] = []

    @ledger.tool("mail.send")
    async def send(to: str) -> str:
        """Send a reminder."""
        sent.append(to)
        return f"sent to {to}"

    @ledger.tool("crm.lookup", scope="call")
    async def lookup(who: str) -> str:
        """Look someone up."""
        return f"{who} ok"

    config = RunConfig(nest_handoff_history=variant == "nest_handoff_history")
    agent = _agents(ledger, variant)
    async with ledger.workflow("w"):
        # An earlier finished turn that used a tool, so the filters have items to drop.
        first = await Runner.run(agent, "look up bo", run_config=config)
        asked: Any = [
            *first.to_input_list(),
            {"role": "user", "content": "tell ada, then hand off"},
        ]
        second = await Runner.run(agent, asked, run_config=config)
    assert second.final_output == "b done"
    assert sent == ["ada"], "B's re-issued call in the same run must not send again"
    effects = (await ledger.list_effects(workflow_id="w", tool="mail.send")).effects
    assert len(effects) == 1 and effects[0].turn is not None

    # The next request is a new Runner.run: a new turn, so the same reminder is sent.
    again = Agent(
        name="a",
        model=ScriptedModel(
            [[function_call("mail_send", {"to": "ada"}, call_id="c1")], [assistant_message("ok")]],
            default_usage=USAGE,
        ),
        tools=as_function_tools(ledger),
    )
    async with ledger.workflow("w"):
        later: Any = [*second.to_input_list(), {"role": "user", "content": "remind ada again"}]
        await Runner.run(again, later, run_config=config)
    assert sent == ["ada", "ada"]
