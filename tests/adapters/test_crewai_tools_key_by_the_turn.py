"""CrewAI: inside ``ledger.workflow(id, turn=...)`` a ledger tool is keyed by the turn.

A retry of the kickoff in the same turn is answered from the receipt; the same
arguments in a later turn run again; a tool that declares ``scope="workflow"``
tells the agent a later turn's call was already done. Through CrewAI's own
``Crew.kickoff`` with a scripted ``BaseLLM`` (no network), and its ``BaseTool.run``.
Runs in CrewAI's own virtualenv (see test_crewai_tools_run_through_the_ledger.py).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, SqliteStore

pytestmark = pytest.mark.crewai

if os.environ.get("AGENT_LEDGER_REQUIRE_CREWAI") == "1":
    import crewai  # noqa: F401  # fail, not skip, where CrewAI must be tested
else:
    pytest.importorskip("crewai", reason="CrewAI is tested in its own virtualenv (.ci/run)")

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402

from agent_ledger.adapters.crewai import as_crewai_tool  # noqa: E402


class Scripted(BaseLLM):  # type: ignore[misc]  # CrewAI is untyped where mypy runs
    """Asks for the reminder, then gives the tool's answer as its final answer."""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(messages, list):
            text = "\n".join(str(m.get("content", "")) for m in messages)
        else:
            text = str(messages)
        observed = [
            o for o in re.findall(r"Observation:\s*(.+)", text) if "result of the action" not in o
        ]
        if not observed:
            return 'Thought: remind her\nAction: mail_remind\nAction Input: {"person": "ada"}'
        return f"Thought: done\nFinal Answer: {observed[-1]}"

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 100_000


def _kickoff(tool: Any) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # CrewAI's own
        clerk = Agent(
            role="clerk",
            goal="send reminders",
            backstory="careful",
            llm=Scripted(model="scripted"),
            tools=[tool],
        )
        task = Task(description="Remind Ada.", expected_output="a note", agent=clerk)
        return str(Crew(agents=[clerk], tasks=[task]).kickoff())


def test_a_kickoff_retried_in_its_turn_runs_once_a_later_turn_runs_again(
    tmp_path: Path,
) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(str(tmp_path / "l.db"))))
    sent: list[str] = []

    @ledger.tool("mail.remind")
    def remind(person: str) -> str:
        """Remind a person."""
        sent.append(person)
        return f"reminded {person}"

    tool = as_crewai_tool(remind)
    for turn in ("monday", "monday", "tuesday"):  # the second plays a retry after a crash
        with ledger.workflow("crew", turn=turn):
            assert "reminded ada" in _kickoff(tool)
    assert sent == ["ada", "ada"]
    effects = ledger.call_sync(ledger.list_effects, workflow_id="crew").effects
    assert sorted((e.scope, e.turn) for e in effects) == [("turn", "monday"), ("turn", "tuesday")]

    # Without a turn: once per workflow and key arguments, as before.
    for _ in range(2):
        with ledger.workflow("no-turns"):
            tool.run(person="bo")
    assert sent.count("bo") == 1
    ledger.close_sync()


def test_a_workflow_scoped_tool_says_a_later_turns_call_was_already_done(
    tmp_path: Path,
) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(str(tmp_path / "l.db"))))
    sent: list[str] = []

    @ledger.tool("mail.welcome", scope="workflow")
    def welcome(person: str) -> dict[str, str]:
        """Welcome a person, once ever."""
        sent.append(person)
        return {"welcomed": person}

    tool = as_crewai_tool(welcome)
    with ledger.workflow("crew", turn="monday"):
        assert tool.run(person="ada") == {"welcomed": "ada"}
        assert tool.run(person="ada") == {"welcomed": "ada"}  # same turn: as it was
    with ledger.workflow("crew", turn="tuesday"):
        told = tool.run(person="ada")
    assert sent == ["ada"]
    assert isinstance(told, str) and "in an earlier turn (receipt " in told
    assert told.endswith('Its result then: {"welcomed":"ada"}')
    ledger.close_sync()
