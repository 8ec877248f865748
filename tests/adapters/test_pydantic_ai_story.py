"""pydantic-ai: the five-part story, through a real ``Agent`` over a scripted model.

``Agent`` runs over pydantic-ai's ``FunctionModel`` (the scripted model below:
it asks for the tool calls a prompt names, then answers with what the tools
returned), a ledger on SQLite. (1) duplicate tool calls run the side effect
once; (2) crash and resume: a fresh ledger and agent on the same store resume
the request (same ``run_id``) without repeating it; (3) approve through
pydantic-ai's deferred tools, recorded with who decided, the tool runs once;
(4) deny through them: the model is told, the effect is denied; (5) the same
arguments in a later run run again, while a repeat within the run is answered
from the receipt. Plus ``ModelRetry`` runs again, a budget refusal ends
``agent.run`` with ``BudgetExceededError``, and replay serves a recorded run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied

from agent_ledger import (
    Budget,
    BudgetExceededError,
    Effect,
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    SqliteStore,
)
from agent_ledger.adapters.pydantic_ai import (
    METADATA_KEY,
    LedgerModel,
    as_pydantic_ai_tool,
    record_decisions,
)
from agent_ledger.effects import Usage

#: What the scripted model asks for, by prompt: (tool name, args) per call.
Plan = dict[str, list[tuple[str, dict[str, Any]]]]


class Script:
    """A scripted model: the calls a prompt names, then the tools' answers as text.

    After a retry prompt it asks for the same call again (what a model does
    with ``ModelRetry``). ``requests`` counts the times it was asked.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.requests = 0
        self.ids = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        retries = [
            p
            for p in last.parts
            if isinstance(p, RetryPromptPart)
            or (isinstance(p, ToolReturnPart) and p.outcome == "retried")
        ]
        if retries:
            asked = _asked(messages, retries[0].tool_call_id)
            return ModelResponse(parts=[self._call(asked.tool_name, asked.args_as_dict())])
        prompts = [p for p in last.parts if isinstance(p, UserPromptPart)]
        if prompts:
            wanted = self.plan[str(prompts[0].content)]
            return ModelResponse(parts=[self._call(name, args) for name, args in wanted])
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(" | ".join(str(p.content) for p in returns))])

    def _call(self, name: str, args: dict[str, Any]) -> ToolCallPart:
        self.ids += 1
        return ToolCallPart(name, args, tool_call_id=f"call_{self.ids}")


def _asked(messages: list[ModelMessage], tool_call_id: str | None) -> ToolCallPart:
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id:
                    return part
    raise AssertionError(f"no call {tool_call_id}")


def _ledger(path: Path) -> EffectLedger:
    return EffectLedger(EffectLedgerOptions(store=SqliteStore(str(path))))


def _charge(ledger: EffectLedger, charged: list[str], **options: Any) -> Any:
    @ledger.tool("payments.charge", idempotency_keys=["order_id"], **options)
    async def charge(order_id: str, amount: int, *, effect: Effect) -> dict[str, Any]:
        """Charge an order."""
        charged.append(order_id)
        return {"charged": order_id, "amount": amount}

    return charge


def _agent(script: Script, *tools: Any, output: Any = str) -> Agent[None, Any]:
    return Agent(FunctionModel(script), tools=list(tools), output_type=output)


O1 = ("payments_charge", {"order_id": "o1", "amount": 5})


async def test_duplicate_calls_in_a_run_charge_once(tmp_path: Path) -> None:
    """(1) The model asks for the same charge three times in one response: one charge,
    three identical answers."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    script = Script({"charge o1": [O1, O1, O1]})
    agent = _agent(script, as_pydantic_ai_tool(_charge(ledger, charged)))
    async with ledger.workflow("order-1"):
        result = await agent.run("charge o1")
    assert charged == ["o1"]
    assert result.output == " | ".join(["{'charged': 'o1', 'amount': 5}"] * 3)
    await ledger.store.close()


async def test_a_restarted_request_does_not_charge_again(tmp_path: Path) -> None:
    """(2) After a crash (a fresh ledger, agent and model on the same store), the request
    run again as the same turn (``run_id``) is answered from the receipt."""
    charged: list[str] = []
    first = _ledger(tmp_path / "l.db")
    agent = _agent(Script({"charge o1": [O1]}), as_pydantic_ai_tool(_charge(first, charged)))
    async with first.workflow("order-2"):
        await agent.run("charge o1", run_id="request-7")
    await first.store.close()  # the process dies here

    again = _ledger(tmp_path / "l.db")
    agent = _agent(Script({"charge o1": [O1]}), as_pydantic_ai_tool(_charge(again, charged)))
    async with again.workflow("order-2"):
        result = await agent.run("charge o1", run_id="request-7")
    assert charged == ["o1"]
    assert result.output == "{'charged': 'o1', 'amount': 5}"
    await again.store.close()


async def test_approval_through_deferred_tools_runs_the_tool_once(tmp_path: Path) -> None:
    """(3) A call needing approval ends the run with ``DeferredToolRequests`` carrying the
    receipt; the application's approval, recorded with who decided, runs it once."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    tool = as_pydantic_ai_tool(_charge(ledger, charged, requires_approval=True))
    agent = _agent(Script({"charge o1": [O1]}), tool, output=[str, DeferredToolRequests])
    async with ledger.workflow("order-3"):
        paused = await agent.run("charge o1")
        requests = paused.output
        assert isinstance(requests, DeferredToolRequests)
        (call,) = requests.approvals
        receipt = requests.metadata[call.tool_call_id][METADATA_KEY]
        assert receipt["tool"] == "payments.charge"
        assert receipt["args"] == {"order_id": "o1", "amount": 5}
        assert charged == []
        pending = await ledger.find_by_idem_key(receipt["key"])
        assert pending is not None and pending.status is EffectStatus.REQUIRES_APPROVAL

        results = DeferredToolResults(approvals={call.tool_call_id: True})
        await record_decisions(ledger, requests, results, by="ada")
        done = await agent.run(message_history=paused.all_messages(), deferred_tool_results=results)
        # A second resume of the same history does not charge again either.
        await agent.run(message_history=paused.all_messages(), deferred_tool_results=results)
    assert done.output == "{'charged': 'o1', 'amount': 5}"
    assert charged == ["o1"]
    effect = await ledger.find_by_idem_key(receipt["key"])
    assert effect is not None and effect.status is EffectStatus.SUCCEEDED
    assert effect.decided_by == "ada" and effect.executions == 1
    await ledger.store.close()


async def test_denial_through_deferred_tools_tells_the_model_and_denies_the_effect(
    tmp_path: Path,
) -> None:
    """(4) The application's ``ToolDenied``: the model reads the denial, the ledger
    effect is denied by who decided (not left pending), nothing ran."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    tool = as_pydantic_ai_tool(_charge(ledger, charged, requires_approval=True))
    agent = _agent(Script({"charge o1": [O1]}), tool, output=[str, DeferredToolRequests])
    async with ledger.workflow("order-4"):
        paused = await agent.run("charge o1")
        requests = paused.output
        assert isinstance(requests, DeferredToolRequests)
        (call,) = requests.approvals
        key = requests.metadata[call.tool_call_id][METADATA_KEY]["key"]
        results = DeferredToolResults(
            approvals={call.tool_call_id: ToolDenied("over the limit")},
            answered_by={call.tool_call_id: "bob"},
        )
        await record_decisions(ledger, requests, results, by="ops")
        done = await agent.run(message_history=paused.all_messages(), deferred_tool_results=results)
    assert done.output == "over the limit"
    assert charged == []
    effect = await ledger.find_by_idem_key(key)
    assert effect is not None and effect.status is EffectStatus.DENIED
    assert effect.decided_by == "bob"
    assert effect.error is not None and effect.error.message == "over the limit"
    await ledger.store.close()


async def test_a_later_run_charges_again_and_a_repeat_within_a_run_does_not(
    tmp_path: Path,
) -> None:
    """(5) scope="turn" (the adapter's default): the same arguments in a later run (a new
    request) run again; within a run, a repeat is answered from the receipt."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    agent = _agent(Script({"charge o1": [O1, O1]}), as_pydantic_ai_tool(_charge(ledger, charged)))
    async with ledger.workflow("order-5"):
        await agent.run("charge o1")
        assert charged == ["o1"]
        await agent.run("charge o1")
    assert charged == ["o1", "o1"]
    await ledger.store.close()


async def test_a_workflow_scoped_tool_tells_a_later_run_it_was_already_done(
    tmp_path: Path,
) -> None:
    """A tool declared ``scope="workflow"`` is not run again in a later run, and the
    model reads that it was done earlier, with the receipt, not that it just happened."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    tool = as_pydantic_ai_tool(_charge(ledger, charged, scope="workflow"))
    agent = _agent(Script({"charge o1": [O1]}), tool)
    async with ledger.workflow("order-6"):
        first = await agent.run("charge o1")
        later = await agent.run("charge o1")
    assert charged == ["o1"]
    assert first.output == "{'charged': 'o1', 'amount': 5}"
    assert later.output.startswith("Already done at ")
    assert "in an earlier turn" in later.output
    assert '{"charged":"o1","amount":5}' in later.output
    await ledger.store.close()


async def test_model_retry_runs_the_tool_again(tmp_path: Path) -> None:
    """A tool raising ``ModelRetry`` is a retryable failure: the model's retry (same
    arguments) runs it again, and the run ends normally, not with EffectFailedError."""
    ledger = _ledger(tmp_path / "l.db")
    tries: list[int] = []

    @ledger.tool("inventory.reserve")
    async def reserve(sku: str) -> str:
        """Reserve an item."""
        tries.append(1)
        if len(tries) == 1:
            raise ModelRetry("the warehouse is busy, try again")
        return f"reserved {sku}"

    script = Script({"reserve x": [("inventory_reserve", {"sku": "x"})]})
    agent = _agent(script, as_pydantic_ai_tool(reserve))
    async with ledger.workflow("order-7"):
        result = await agent.run("reserve x")
    assert result.output == "reserved x"
    assert len(tries) == 2
    await ledger.store.close()


async def test_a_budget_refusal_ends_the_run_with_budget_exceeded(tmp_path: Path) -> None:
    """Over the workflow's tool-call budget, ``agent.run`` raises ``BudgetExceededError``
    (the application's to handle), and the refused call does not run."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    two = [O1, ("payments_charge", {"order_id": "o2", "amount": 5})]
    agent = _agent(Script({"charge both": two}), as_pydantic_ai_tool(_charge(ledger, charged)))
    async with ledger.workflow("order-8", budget=Budget(tool_calls=1)):
        with pytest.raises(BudgetExceededError):
            await agent.run("charge both")
    assert len(charged) == 1
    await ledger.store.close()


#: What one scripted model request may use at most, reserved under a dollar budget.
ESTIMATE = Usage(input_tokens=100, output_tokens=20)


def _pricing(provider: str, model: str, usage: Usage) -> float:
    return (usage.input_tokens + usage.output_tokens) / 100_000


async def test_model_calls_are_recorded_and_a_dollar_budget_refuses_before_the_model(
    tmp_path: Path,
) -> None:
    """``LedgerModel``: each model request is a ledger effect with usage and price; when
    the budget is spent the next request raises before the scripted model is asked."""
    ledger = _ledger(tmp_path / "l.db")
    charged: list[str] = []
    script = Script({"charge o1": [O1]})
    model = LedgerModel(FunctionModel(script), ledger, pricing=_pricing, estimate=ESTIMATE)
    agent = Agent(model, tools=[as_pydantic_ai_tool(_charge(ledger, charged))])
    async with ledger.workflow("order-9", budget=Budget(usd=0.05)):
        await agent.run("charge o1")
        spent = await ledger.budget("order-9")
        assert script.requests == 2 and spent is not None and spent.spent.usd_micros > 0
        llm = [e for e in (await ledger.list_effects(workflow_id="order-9")).effects if e.usage]
        assert len(llm) == 2 and all(e.tool == "llm.function" for e in llm)
    # A budget smaller than one request's estimate: refused before the model is asked.
    asked = script.requests
    async with ledger.workflow("order-10", budget=Budget(usd=0.0001)):
        with pytest.raises(BudgetExceededError):
            await agent.run("charge o1")
    assert script.requests == asked
    await ledger.store.close()


async def test_replay_serves_the_recorded_run_without_the_model_or_the_tool(
    tmp_path: Path,
) -> None:
    """A recorded run replayed (``ledger.replay``) gets the model's replies and the
    tools' results from the recording: the scripted model and the tool never run."""
    source = _ledger(tmp_path / "recorded.db")
    charged: list[str] = []
    script = Script({"charge o1": [O1]})
    agent = Agent(
        LedgerModel(FunctionModel(script), source, pricing=_pricing),
        tools=[as_pydantic_ai_tool(_charge(source, charged))],
    )
    async with source.workflow("order-11"):
        recorded = await agent.run("charge o1", run_id="request-1")
    assert (script.requests, charged) == (2, ["o1"])

    debug = _ledger(tmp_path / "debug.db")
    later = Script({"charge o1": [O1]})
    replaying = Agent(
        LedgerModel(FunctionModel(later), debug, pricing=_pricing),
        tools=[as_pydantic_ai_tool(_charge(debug, charged))],
    )
    async with debug.replay("order-11", source=source.store):
        replayed = await replaying.run("charge o1", run_id="request-1")
    assert replayed.output == recorded.output
    assert later.requests == 0 and charged == ["o1"]
    await source.store.close()
    await debug.store.close()
