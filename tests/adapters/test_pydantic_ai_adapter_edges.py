"""pydantic-ai adapter: approvals decided elsewhere, the call scope, RunContext, bad
arguments, and a real process killed mid-run and resumed.

Real ``Agent`` runs over the story's scripted ``FunctionModel``, a ledger on SQLite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from agent_ledger import Effect, EffectLedgerValidationError, EffectStatus
from agent_ledger.adapters.pydantic_ai import METADATA_KEY, as_pydantic_ai_tool
from tests.adapters.test_pydantic_ai_story import O1, Script, _agent, _charge, _ledger

ROOT = Path(__file__).resolve().parents[2]


async def _paused(agent: Agent[None, Any]) -> tuple[Any, DeferredToolRequests, str, str]:
    paused = await agent.run("charge o1")
    requests = paused.output
    assert isinstance(requests, DeferredToolRequests)
    (call,) = requests.approvals
    key = requests.metadata[call.tool_call_id][METADATA_KEY]["key"]
    return paused, requests, call.tool_call_id, key


async def test_an_approval_passed_straight_to_the_run_is_recorded_by_the_adapter(
    tmp_path: Path,
) -> None:
    """``DeferredToolResults`` given to ``agent.run`` without ``record_decisions``: the
    approved call runs once, and the ledger records the approval by its ``"by"``."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    tool = as_pydantic_ai_tool(_charge(ledger, charged, requires_approval=True))
    agent = _agent(Script({"charge o1": [O1]}), tool, output=[str, DeferredToolRequests])
    async with ledger.workflow("edge-1"):
        paused, _, call_id, key = await _paused(agent)
        results = DeferredToolResults(
            approvals={call_id: True}, metadata={call_id: {"by": "carol"}}
        )
        await agent.run(message_history=paused.all_messages(), deferred_tool_results=results)
    assert charged == ["o1"]
    effect = await ledger.find_by_idem_key(key)
    assert effect is not None and effect.status is EffectStatus.SUCCEEDED
    assert effect.decided_by == "carol"
    await ledger.store.close()


async def test_a_denial_made_in_the_ledger_first_stands_over_the_runs_approval(
    tmp_path: Path,
) -> None:
    """Denied with the CLI's ``ledger.deny`` before the application approved through
    pydantic-ai: the resumed call does not run, and the model reads the denial."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    tool = as_pydantic_ai_tool(_charge(ledger, charged, requires_approval=True))
    agent = _agent(Script({"charge o1": [O1]}), tool, output=[str, DeferredToolRequests])
    async with ledger.workflow("edge-2"):
        paused, _, call_id, key = await _paused(agent)
        await ledger.deny(key, "fraud check", by="risk")
        results = DeferredToolResults(approvals={call_id: True})
        done = await agent.run(message_history=paused.all_messages(), deferred_tool_results=results)
    assert charged == []
    assert done.output.startswith("A person denied this call (fraud check)")
    await ledger.store.close()


async def test_scope_call_runs_each_tool_call_id_once(tmp_path: Path) -> None:
    """``as_pydantic_ai_tool(tool, scope="call")``: three calls with three ids are three
    effects; the run's id is recorded on each as its ``call_id``."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    tool = as_pydantic_ai_tool(_charge(ledger, charged), scope="call")
    agent = _agent(Script({"charge o1": [O1, O1, O1]}), tool)
    async with ledger.workflow("edge-3"):
        await agent.run("charge o1")
    assert charged == ["o1", "o1", "o1"]
    effects = (await ledger.list_effects(workflow_id="edge-3")).effects
    assert sorted(e.call_id or "" for e in effects) == ["call_1", "call_2", "call_3"]
    await ledger.store.close()


async def test_run_context_reaches_a_ledger_tool_through_the_adapter(tmp_path: Path) -> None:
    """A ledger tool taking ``RunContext`` first gets the run's deps; the schema and the
    key hold only the model's arguments."""
    ledger = _ledger(tmp_path / "l.db")
    seen: list[str] = []

    @ledger.tool("mail.send")
    async def send(ctx: RunContext[str], to: str, *, effect: Effect) -> str:
        """Send a mail."""
        seen.append(ctx.deps)
        return f"{ctx.deps} mailed {to}"

    tool = as_pydantic_ai_tool(send)
    assert set(tool.function_schema.json_schema["properties"]) == {"to"}
    agent = Agent(
        FunctionModel(Script({"mail": [("mail_send", {"to": "ada"})]})),
        tools=[tool],
        deps_type=str,
    )
    async with ledger.workflow("edge-4"):
        result = await agent.run("mail", deps="ops")
    assert result.output == "ops mailed ada" and seen == ["ops"]
    (effect,) = (await ledger.list_effects(workflow_id="edge-4")).effects
    assert effect.args == {"to": "ada"}
    await ledger.store.close()


async def test_arguments_a_key_cannot_hold_ask_the_model_to_retry_and_store_nothing(
    tmp_path: Path,
) -> None:
    """An integer beyond 64 bits fits pydantic's ``int`` but no key: the model is asked
    to retry (ModelRetry) until pydantic-ai gives up; nothing ran or was stored."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    huge = ("payments_charge", {"order_id": "o1", "amount": 2**70})
    agent = _agent(Script({"charge o1": [huge]}), as_pydantic_ai_tool(_charge(ledger, charged)))
    async with ledger.workflow("edge-5"):
        with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries"):
            await agent.run("charge o1")
    assert charged == []
    assert (await ledger.list_effects(workflow_id="edge-5")).effects == []
    await ledger.store.close()


async def test_a_declared_retryable_failure_asks_the_model_to_retry(tmp_path: Path) -> None:
    """A tool's own exception declared ``retryable=`` reaches the model as a retry
    (saying a call with the same arguments runs it again), and the retry runs it."""
    ledger = _ledger(tmp_path / "l.db")
    tries: list[int] = []

    @ledger.tool("mail.send", retryable=(ConnectionError,))
    async def send(to: str) -> str:
        """Send a mail."""
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("smtp is down")
        return f"sent to {to}"

    agent = _agent(Script({"mail": [("mail_send", {"to": "ada"})]}), as_pydantic_ai_tool(send))
    async with ledger.workflow("edge-6"):
        result = await agent.run("mail")
    assert result.output == "sent to ada" and len(tries) == 2
    retried = [
        part
        for message in result.all_messages()
        for part in getattr(message, "parts", [])
        if getattr(part, "outcome", None) == "retried"
    ]
    assert len(retried) == 1 and "smtp is down" in str(retried[0].content)
    await ledger.store.close()


def test_a_ledger_tool_refused_where_it_is_not_one() -> None:
    """``as_pydantic_ai_tool`` takes a ledger tool and says so otherwise."""
    with pytest.raises(EffectLedgerValidationError, match="takes a ledger tool"):
        as_pydantic_ai_tool(print)  # type: ignore[arg-type]


CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pydantic_ai.models.function import FunctionModel
    from agent_ledger.adapters.pydantic_ai import as_pydantic_ai_tool
    from tests.adapters.test_pydantic_ai_story import O1, Script, _agent, _charge, _ledger

    charged = []

    class Dies(Script):
        def __call__(self, messages, info):
            if self.requests == 1:  # the tool ran and its receipt is stored
                Path({marker!r}).write_text(",".join(charged))
                os.kill(os.getpid(), signal.SIGKILL)
            return super().__call__(messages, info)

    async def main():
        ledger = _ledger(Path({db!r}))
        agent = _agent(Dies({{"charge o1": [O1]}}), as_pydantic_ai_tool(_charge(ledger, charged)))
        async with ledger.workflow("killed"):
            await agent.run("charge o1", run_id="request-9")

    asyncio.run(main())
    """
)


@pytest.mark.slow
async def test_a_process_killed_after_the_charge_is_resumed_without_charging_again(
    tmp_path: Path,
) -> None:
    """A real process charges, then is SIGKILLed before the run ends; a new process
    (here: this one) runs the same request (same ``run_id``) and is not charged again."""
    db, marker = tmp_path / "l.db", tmp_path / "charged"
    script = CHILD.format(root=str(ROOT), db=str(db), marker=str(marker))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert marker.read_text() == "o1"

    ledger = _ledger(db)
    charged: list[str] = []
    agent = _agent(Script({"charge o1": [O1]}), as_pydantic_ai_tool(_charge(ledger, charged)))
    async with ledger.workflow("killed"):
        result = await agent.run("charge o1", run_id="request-9")
    assert charged == []
    assert result.output == "{'charged': 'o1', 'amount': 5}"
    await ledger.store.close()
    assert os.path.exists(db)
