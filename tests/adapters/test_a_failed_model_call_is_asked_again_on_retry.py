"""A model call the provider failed to answer is not final for its turn: the turn's
retry or resume asks the model again, and the side effects already made are answered
from their receipts. A budget books each call that answered once, and the failure
(nothing consumed) nothing.

Under all three model wrappers, through the frameworks' own runners: the Agents SDK's
``Runner`` with ``LedgerModel`` over its ``ScriptedModel``, pydantic-ai's ``Agent`` with
``LedgerModel`` over ``FunctionModel``, and LangChain's ``create_agent`` with
``record_model_calls`` and a checkpointer (resumed with ``invoke(None, config)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent as SdkAgent
from agents import Runner, set_tracing_disabled
from agents import Usage as SdkUsage
from agents.testing import ScriptedModel, assistant_message, function_call
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent_ledger import Budget, EffectLedger, EffectLedgerOptions, MemoryStore, SqliteStore
from agent_ledger.adapters import openai_agents as oa
from agent_ledger.adapters import pydantic_ai as pai
from agent_ledger.adapters.langchain import as_langchain_tool, record_model_calls
from agent_ledger.effects import Usage
from agent_ledger.status import EffectStatus
from tests.adapters.scripted_chat import ScriptedChat

set_tracing_disabled(True)


class ProviderDown(Exception):
    """The provider's 503."""


def _mailer(store: Any, sent: list[str]) -> EffectLedger:
    ledger = EffectLedger(EffectLedgerOptions(store=store))

    @ledger.tool("mail.send")
    async def send(to: str) -> str:
        """Send a reminder."""
        sent.append(to)
        return f"sent to {to}"

    return ledger


async def _model_calls(ledger: EffectLedger, workflow: str) -> list[Any]:
    effects = (await ledger.list_effects(workflow_id=workflow)).effects
    return [e for e in effects if e.tool.startswith("llm.")]


class _FailsOnce(ScriptedModel):
    """The SDK's scripted model, its provider failing on the call numbered ``fail_at``."""

    def __init__(self, script: Any, fail_at: int | None) -> None:
        super().__init__(script, default_usage=SdkUsage(requests=1, input_tokens=100))
        self.fail_at, self.asked = fail_at, 0

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        if self.asked == self.fail_at:
            raise ProviderDown("503 from the provider")
        return await super().get_response(*args, **kwargs)


async def test_agents_sdk_ledger_model_a_retried_request_asks_the_model_again(
    tmp_path: Path,
) -> None:
    path, sent = str(tmp_path / "ledger.db"), list[str]()

    def price(provider: str, model: str, usage: Usage) -> float:
        return usage.input_tokens / 1000  # 0.1 USD a call

    def agent(ledger: EffectLedger, model: _FailsOnce) -> SdkAgent[Any]:
        wrapped = oa.LedgerModel(
            model, ledger, name="scripted", pricing=price, estimate=Usage(input_tokens=100)
        )
        return SdkAgent(name="a", model=wrapped, tools=oa.as_function_tools(ledger))

    first = _FailsOnce(
        [[function_call("mail_send", {"to": "ada"}, call_id="c1")], [assistant_message("x")]],
        fail_at=2,
    )
    ledger = _mailer(SqliteStore(path), sent)
    with pytest.raises(ProviderDown):  # the model's call after the tool fails
        async with ledger.workflow("w", turn="req-1", budget=Budget(usd=1.0)):
            await Runner.run(agent(ledger, first), "remind ada")
    assert sent == ["ada"] and first.asked == 2

    # The same request again, in a new process: the first model call and the tool are
    # answered from their receipts, the failed one asks the model again.
    again = _FailsOnce([[assistant_message("done")]], fail_at=None)
    ledger = _mailer(SqliteStore(path), sent)
    async with ledger.workflow("w", turn="req-1", budget=Budget(usd=1.0)):
        result = await Runner.run(agent(ledger, again), "remind ada")
    assert result.final_output == "done" and again.asked == 1 and sent == ["ada"]
    state = await ledger.budget("w")
    assert state is not None
    spent = state.spent
    assert spent.usd_micros == 200_000 and spent.input_tokens == 200  # two answers, once each
    calls = await _model_calls(ledger, "w")
    assert sorted(c.status for c in calls) == [EffectStatus.SUCCEEDED, EffectStatus.SUCCEEDED]
    retried = next(c for c in calls if c.attempt > 1)
    assert "ProviderDown" in str(retried.history)  # the failure stays on the receipt's history


async def test_pydantic_ai_ledger_model_a_retried_request_asks_the_model_again() -> None:
    sent: list[str] = []
    ledger = _mailer(MemoryStore(), sent)
    down, asked = [True], [0]

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked[0] += 1
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            if down.pop() if down else False:
                raise ProviderDown("503 from the provider")
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("mail_send", {"to": "ada"}, tool_call_id="c1")])

    agent = Agent(
        pai.LedgerModel(FunctionModel(script), ledger),
        tools=[pai.as_pydantic_ai_tool(ledger.tools["mail.send"])],
    )
    with pytest.raises(ProviderDown):
        async with ledger.workflow("w"):
            await agent.run("remind ada", run_id="request-1")
    assert sent == ["ada"] and asked[0] == 2
    # The docs' restart: the same request again with its run_id.
    async with ledger.workflow("w"):
        result = await agent.run("remind ada", run_id="request-1")
    assert result.output == "done" and sent == ["ada"]
    assert asked[0] == 3  # only the failed call asked the model again
    calls = await _model_calls(ledger, "w")
    assert [c.status for c in calls] == [EffectStatus.SUCCEEDED] * 2


def test_langchain_record_model_calls_a_resumed_thread_asks_the_model_again() -> None:
    sent: list[str] = []
    ledger = _mailer(MemoryStore(), sent)
    down = [True]

    def reply(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            if down.pop() if down else False:
                raise ProviderDown("503 from the provider")
            return AIMessage("done")
        return AIMessage("", tool_calls=[{"name": "send", "args": {"to": "ada"}, "id": "c1"}])

    chat = ScriptedChat(reply=reply)
    app = create_agent(
        record_model_calls(ledger, chat, provider="scripted"),
        [as_langchain_tool(ledger.tools["mail.send"], name="send")],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "t1"}}
    with pytest.raises(ProviderDown):
        app.invoke({"messages": [HumanMessage("remind ada", id="h1")]}, config)
    assert sent == ["ada"] and len(chat.calls) == 2
    result = app.invoke(None, config)  # LangGraph's resume of the failed step
    assert result["messages"][-1].content == "done" and sent == ["ada"]
    assert len(chat.calls) == 3  # the failed call asked again, nothing else
