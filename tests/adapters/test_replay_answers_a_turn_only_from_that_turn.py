"""Replay answers a call keyed by its turn only from the call recorded in that same turn.

A framework often names a turn anew on every run (pydantic-ai's run id, the id LangGraph
makes up for a ``HumanMessage`` without one). The replay never guesses which recorded
turn a new one stands for (guessing by order served one request's recorded result to
another when the replay had fewer turns or another order): a call in a turn the
recording lacks fails with ``UnrecordedEffectError`` saying the turn differs and what to
pass, and a replay that names its turns (``run_id=``, message ids,
``ledger.workflow(id, turn=...)``) gets each turn's own result, in any order.

pydantic-ai's ``Agent`` over ``FunctionModel`` and LangChain's ``create_agent`` over a
scripted chat model, with a checkpointer: the frameworks' own runners.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
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

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore
from agent_ledger.adapters.langchain import as_langchain_tool
from agent_ledger.adapters.pydantic_ai import LedgerModel, as_pydantic_ai_tool
from agent_ledger.errors import UnrecordedEffectError
from tests.adapters.scripted_chat import ScriptedChat, calls_tools

_FIRST, _SECOND = "price of x?", "and now, price of x?"


def _shop(store: MemoryStore, prices: list[int]) -> tuple[EffectLedger, Any]:
    ledger = EffectLedger(EffectLedgerOptions(store=store))

    @ledger.tool("shop.quote")
    async def quote(sku: str) -> str:
        """The current price of a sku."""
        return f"price {prices.pop(0)}"

    return ledger, quote


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(str(returned[0].content))])
    return ModelResponse(parts=[ToolCallPart("shop_quote", {"sku": "x"}, tool_call_id="c1")])


def _agent(ledger: EffectLedger, quote: Any, *, model_calls: bool) -> Agent[None, str]:
    model: Any = FunctionModel(_script)
    return Agent(
        LedgerModel(model, ledger) if model_calls else model, tools=[as_pydantic_ai_tool(quote)]
    )


async def _record(*, model_calls: bool, named: bool) -> MemoryStore:
    """Two requests in workflow "w", the price changing between them (10, then 12)."""
    store = MemoryStore()
    ledger, quote = _shop(store, [10, 12])
    agent = _agent(ledger, quote, model_calls=model_calls)
    outputs = []
    for prompt in (_FIRST, _SECOND):
        async with ledger.workflow("w", turn=prompt if named else None):
            outputs.append((await agent.run(prompt)).output)
    assert outputs == ["price 10", "price 12"]
    return store


@pytest.mark.parametrize("model_calls", [False, True], ids=["tools", "tools-and-model"])
@pytest.mark.parametrize(
    "prompts", [[_SECOND], [_SECOND, _FIRST], [_FIRST, _SECOND]], ids=["fewer", "swapped", "same"]
)
async def test_a_replay_with_unnamed_turns_is_refused_not_served_another_turns_result(
    model_calls: bool, prompts: list[str]
) -> None:
    store = await _record(model_calls=model_calls, named=False)
    replayer, quote = _shop(MemoryStore(), [])  # the replay must not call the tool
    agent = _agent(replayer, quote, model_calls=False)
    async with replayer.replay("w", source=store):
        with pytest.raises(UnrecordedEffectError) as unrecorded:
            await agent.run(prompts[0])
    text = str(unrecorded.value)
    assert "has no recording in its turn" in text and "keys a call by its turn" in text
    assert "run_id=" in text and "ledger.workflow(id, turn=...)" in text


@pytest.mark.parametrize("model_calls", [False, True], ids=["tools", "tools-and-model"])
@pytest.mark.parametrize(
    "prompts", [[_SECOND], [_SECOND, _FIRST], [_FIRST, _SECOND]], ids=["fewer", "swapped", "same"]
)
async def test_a_replay_that_names_its_turns_gets_each_turns_own_result(
    model_calls: bool, prompts: list[str]
) -> None:
    store = await _record(model_calls=model_calls, named=True)
    replayer, quote = _shop(MemoryStore(), [])
    agent = _agent(replayer, quote, model_calls=model_calls)
    replayed = {}
    async with replayer.replay("w", source=store):
        for prompt in prompts:
            async with replayer.workflow("w", turn=prompt):
                replayed[prompt] = (await agent.run(prompt)).output
    expected = {_FIRST: "price 10", _SECOND: "price 12"}
    assert replayed == {prompt: expected[prompt] for prompt in prompts}


async def test_a_langgraph_replay_answers_by_message_id_and_refuses_made_up_ids() -> None:
    prices = [10, 12]
    store = MemoryStore()
    _, quote = _shop(store, prices)

    def agent(tool: Any) -> Any:
        model = ScriptedChat(reply=calls_tools(("quote", {"sku": "x"})))
        return create_agent(
            model, [as_langchain_tool(tool, name="quote")], checkpointer=InMemorySaver()
        )

    config: Any = {"configurable": {"thread_id": "t"}}
    app = agent(quote)
    recorded = {}
    for turn in ("m1", "m2"):
        result = await app.ainvoke({"messages": [HumanMessage("price of x?", id=turn)]}, config)
        recorded[turn] = [m.content for m in result["messages"] if m.type == "tool"][-1]
    assert recorded == {"m1": "price 10", "m2": "price 12"}

    # The second request alone, by its id: its own result, not the first's.
    replayer, quote_again = _shop(MemoryStore(), [])
    app = agent(quote_again)
    async with replayer.replay("t", source=store):
        result = await app.ainvoke({"messages": [HumanMessage("price of x?", id="m2")]}, config)
    assert [m.content for m in result["messages"] if m.type == "tool"][-1] == "price 12"

    # A message without an id (LangGraph makes one up): refused, saying the turn differs.
    replayer, quote_again = _shop(MemoryStore(), [])
    app = agent(quote_again)
    async with replayer.replay("t", source=store):
        with pytest.raises(UnrecordedEffectError, match="has no recording in its turn"):
            await app.ainvoke({"messages": [HumanMessage("price of x?")]}, config)
