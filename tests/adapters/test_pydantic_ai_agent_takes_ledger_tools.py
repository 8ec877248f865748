"""pydantic-ai: a ledger tool given straight to ``Agent(tools=[...])`` runs through the ledger.

It used to raise ``RecursionError``: pydantic-ai builds a tool's schema from
``inspect.signature``, which followed the ledger tool's ``__wrapped__`` to the
function and its ``effect: Effect`` parameter, whose JSON type pydantic cannot
finish. A ledger tool now shows the signature a call takes (``effect`` left
out), and a leading ``RunContext`` parameter is passed through, out of the key.
Real ``Agent`` runs over ``TestModel`` (which calls every tool once).
"""

from __future__ import annotations

import inspect
from pathlib import Path

from pydantic_ai import Agent, RunContext
from pydantic_ai.models.test import TestModel

from agent_ledger import Effect, EffectLedger, EffectLedgerOptions, SqliteStore


def _ledger(tmp_path: Path) -> EffectLedger:
    return EffectLedger(EffectLedgerOptions(store=SqliteStore(str(tmp_path / "l.db"))))


def test_signature_of_a_ledger_tool_leaves_out_effect(tmp_path: Path) -> None:
    """``inspect.signature(tool)`` is what a call takes: no ``effect``."""
    ledger = _ledger(tmp_path)

    @ledger.tool("mail.send")
    async def send(to: str, text: str = "hi", *, effect: Effect) -> str:
        return to

    assert list(inspect.signature(send).parameters) == ["to", "text"]
    assert list(send.signature.parameters) == ["to", "text", "effect"]


async def test_agent_with_a_ledger_tool_runs_it_once_per_key(tmp_path: Path) -> None:
    """``Agent(tools=[ledger_tool])`` builds (no RecursionError), and two runs in one
    workflow send once: the second is answered from the receipt."""
    ledger = _ledger(tmp_path)
    sent: list[str] = []

    @ledger.tool("mail.send")
    async def send(to: str, text: str, *, effect: Effect) -> str:
        """Send a mail."""
        sent.append(to)
        return f"sent to {to}"

    agent = Agent(TestModel(), tools=[send])
    async with ledger.workflow("w1"):
        first = await agent.run("mail a")
        second = await agent.run("mail a")
    assert first.output == second.output == '{"send":"sent to a"}'
    assert sent == ["a"]
    await ledger.store.close()


async def test_run_context_is_passed_through_and_kept_out_of_the_key(tmp_path: Path) -> None:
    """A ledger tool whose first parameter is ``RunContext`` gets the run's context
    (its deps), and the key and the recorded args hold only the model's arguments."""
    ledger = _ledger(tmp_path)
    seen: list[tuple[str, str]] = []

    @ledger.tool("mail.send")
    async def send(ctx: RunContext[str], to: str, *, effect: Effect) -> str:
        """Send a mail."""
        seen.append((ctx.deps, to))
        return f"{ctx.deps} mailed {to}"

    assert send.context_parameter == "ctx"
    agent = Agent(TestModel(), tools=[send], deps_type=str)
    async with ledger.workflow("w1"):
        result = await agent.run("mail a", deps="ops")
        again = await agent.run("mail a", deps="someone else")
        key = ledger.idem_key(send.tool_call(to="a"))
    assert result.output == again.output == '{"send":"ops mailed a"}'
    assert seen == [("ops", "a")]
    effect = await ledger.find_by_idem_key(key)
    assert effect is not None and effect.args == {"to": "a"}
    await ledger.store.close()
