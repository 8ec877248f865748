"""Agents SDK with a ``Session``: a request retried after a run died unfinished is the
same turn, a new request with the same text after a finished turn is a new one.

The run dies after the tool ran (the model's next call raises), leaving the user
message and the tool's items in the session; the application sends the same request
again on the same session in a new process (a fresh ledger on the same file). The
side effect must not happen twice. Through the real ``Runner``, ``SQLiteSession`` and
the SDK's own ``ScriptedModel``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, SQLiteSession, ToolCallOutputItem, Usage, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from agent_ledger import EffectLedger, EffectLedgerOptions, SqliteStore
from agent_ledger.adapters.openai_agents import as_function_tools, run_turn

set_tracing_disabled(True)
USAGE = Usage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2)


class ProcessDied(Exception):
    """The model's second call fails: the run dies between the tool and its answer."""


class DiesAfterTheTool(ScriptedModel):
    """The SDK's scripted model, raising on its second call."""

    asked = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        if self.asked == 2:
            raise ProcessDied("the process died")
        return await super().get_response(*args, **kwargs)


class Mailer:
    """A ledger on a SQLite file (one per process) with a mail tool."""

    def __init__(self, path: Path, sent: list[str]) -> None:
        self.ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(str(path))))

        @self.ledger.tool("mail.send")
        async def send(to: str) -> str:
            """Send a reminder."""
            sent.append(to)
            return f"sent to {to}"

    def agent(self, model: Any) -> Agent[Any]:
        return Agent(name="a", model=model, tools=as_function_tools(self.ledger))


def send(call_id: str) -> Any:
    return function_call("mail_send", {"to": "ada"}, call_id=call_id)


def outputs(result: Any) -> list[str]:
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


async def crash_once(tmp_path: Path, sent: list[str], session: SQLiteSession) -> None:
    first = Mailer(tmp_path / "ledger.db", sent)
    dies = DiesAfterTheTool([[send("c1")], [assistant_message("done")]], default_usage=USAGE)
    with pytest.raises(ProcessDied):
        async with first.ledger.workflow("thread-1"):
            await Runner.run(first.agent(dies), "remind ada", session=session)
    assert sent == ["ada"]
    await first.ledger.store.close()


async def test_the_same_request_retried_after_a_crash_does_not_repeat_the_effect(
    tmp_path: Path,
) -> None:
    sent: list[str] = []
    session_path = str(tmp_path / "session.db")
    await crash_once(tmp_path, sent, SQLiteSession("s1", session_path))

    restarted = Mailer(tmp_path / "ledger.db", sent)
    model = ScriptedModel([[send("c9")], [assistant_message("done")]], default_usage=USAGE)
    async with restarted.ledger.workflow("thread-1"):
        retried = await Runner.run(
            restarted.agent(model), "remind ada", session=SQLiteSession("s1", session_path)
        )
    assert sent == ["ada"]
    # Answered from the receipt of the same turn, which the dead run made: not "earlier
    # turn", but the model reads that it was done in an earlier run.
    (output,) = outputs(retried)
    assert output.startswith("Already done at ") and "earlier turn" not in output
    assert ", in an earlier run (receipt " in output and output.endswith("then: sent to ada")
    (effect,) = (await restarted.ledger.list_effects(workflow_id="thread-1")).effects
    assert effect.executions == 1

    # The turn finished (an assistant message): the same text again is a new request.
    model = ScriptedModel([[send("d1")], [assistant_message("done")]], default_usage=USAGE)
    async with restarted.ledger.workflow("thread-1"):
        again = await Runner.run(
            restarted.agent(model), "remind ada", session=SQLiteSession("s1", session_path)
        )
    assert sent == ["ada", "ada"] and outputs(again) == ["sent to ada"]
    await restarted.ledger.store.close()


async def test_a_different_request_after_a_crash_is_a_new_turn(tmp_path: Path) -> None:
    sent: list[str] = []
    session_path = str(tmp_path / "session.db")
    await crash_once(tmp_path, sent, SQLiteSession("s1", session_path))

    restarted = Mailer(tmp_path / "ledger.db", sent)
    model = ScriptedModel([[send("c9")], [assistant_message("done")]], default_usage=USAGE)
    async with restarted.ledger.workflow("thread-1"):
        await Runner.run(
            restarted.agent(model),
            "remind ada once more",
            session=SQLiteSession("s1", session_path),
        )
    assert sent == ["ada", "ada"]
    await restarted.ledger.store.close()


def test_the_turn_is_the_conversation_up_to_the_request_that_started_it() -> None:
    user = {"role": "user", "content": "remind ada"}
    call = {"type": "function_call", "call_id": "c1", "name": "mail_send", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "sent"}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}
    first = run_turn([user])
    # Its own tool items after the request are not part of the turn.
    assert run_turn([user, call, output]) == first
    # A retry right after an unfinished turn (twice, even) continues it.
    assert run_turn([user, call, output, user]) == first
    assert run_turn([user, call, output, user, call, user]) == first
    assert run_turn([user, user]) == first
    # After a finished turn the same text is a new turn; another text always is.
    later = run_turn([user, call, output, answer, user])
    assert later not in (None, first)
    assert run_turn([user, call, output, {"role": "user", "content": "remind bo"}]) != first
    # An input with no user message is its own turn; an empty one has none.
    assert run_turn([call, output]) not in (None, first)
    assert run_turn([]) is None
