"""Agents SDK: with no history in the run's input (the app sends only the new message, or
the server keeps the conversation: ``previous_response_id``), a new request that repeats
an old one cannot be told from a retry, so it is answered from the old receipt. The
model must then read that it was done in an earlier run, with when and the receipt,
never the plain result as if it had just happened. A repeat within one run reads the
plain result; a replay reads what the recorded run read; and a request id given as the
turn (``ledger.workflow(id, turn=request_id)``) makes the repeat run again.

The real ``Runner`` and the SDK's own ``ScriptedModel``.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, Runner, ToolCallOutputItem, Usage, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
from agent_ledger.adapters.openai_agents import as_function_tools

set_tracing_disabled(True)
USAGE = Usage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2)


def _mailer(store: MemoryStore, sent: list[str]) -> EffectLedger:
    ledger = EffectLedger(EffectLedgerOptions(store=store))

    @ledger.tool("mail.send")
    async def send(to: str) -> str:
        """Send a reminder."""
        sent.append(to)
        return f"sent to {to}"

    return ledger


def _send(call_id: str) -> Any:
    return function_call("mail_send", {"to": "ada"}, call_id=call_id)


def _two_days() -> ScriptedModel:
    """Day 1 sends (c1); day 2 sends twice within its run (c2, then c3)."""
    return ScriptedModel(
        [
            [_send("c1")],
            [assistant_message("Reminded Ada.")],
            [_send("c2")],
            [_send("c3")],
            [assistant_message("Reminded Ada.")],
        ],
        default_usage=USAGE,
    )


def _outputs(result: Any) -> list[str]:
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


async def _run_two_days(ledger: EffectLedger) -> list[list[str]]:
    agent = Agent(name="a", model=_two_days(), tools=as_function_tools(ledger))
    read = []
    for _ in range(2):  # the same message, alone, on two days
        async with ledger.workflow("thread-7"):
            read.append(_outputs(await Runner.run(agent, "remind ada")))
    return read


async def test_a_repeat_answered_from_an_earlier_runs_receipt_says_so() -> None:
    store, sent = MemoryStore(), list[str]()
    ledger = _mailer(store, sent)
    day1, day2 = await _run_two_days(ledger)
    assert sent == ["ada"]  # no history: the repeat cannot be told from a retry
    assert day1 == ["sent to ada"]
    (effect,) = (await ledger.list_effects(workflow_id="thread-7")).effects
    first, again = day2
    assert first.startswith("Already done at ") and ", in an earlier run (receipt " in first
    assert effect.idem_key[:12] in first and first.endswith("Its result then: sent to ada")
    assert again == first  # the same call again within day 2's run: the same answer

    # A replay reads what the recorded run read.
    replayer = _mailer(MemoryStore(), sent)
    async with replayer.replay("thread-7", source=store):
        replayed = await _run_two_days(replayer)
    assert replayed == [day1, day2] and sent == ["ada"]


async def test_a_repeat_within_one_run_reads_the_plain_result() -> None:
    sent: list[str] = []
    ledger = _mailer(MemoryStore(), sent)
    model = ScriptedModel(
        [[_send("c1")], [_send("c2")], [assistant_message("done")]], default_usage=USAGE
    )
    agent = Agent(name="a", model=model, tools=as_function_tools(ledger))
    async with ledger.workflow("w"):
        result = await Runner.run(agent, "remind ada")
    assert _outputs(result) == ["sent to ada", "sent to ada"] and sent == ["ada"]


async def test_a_request_id_as_the_turn_makes_the_repeat_run_again() -> None:
    sent: list[str] = []
    ledger = _mailer(MemoryStore(), sent)
    agent = Agent(name="a", model=_two_days(), tools=as_function_tools(ledger))
    read = []
    for request in ("req-1", "req-2"):
        async with ledger.workflow("thread-7", turn=request):
            read.append(_outputs(await Runner.run(agent, "remind ada")))
    assert sent == ["ada", "ada"]
    assert read == [["sent to ada"], ["sent to ada", "sent to ada"]]
