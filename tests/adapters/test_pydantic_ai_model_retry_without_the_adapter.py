"""pydantic-ai: a ledger tool given to ``Agent(tools=[tool])`` without the adapter that
raises ``ModelRetry`` runs again when the model calls again, instead of crashing the
run with ``EffectFailedError`` on the retry.

Through pydantic-ai's own ``Agent.run`` and ``FunctionModel``.
"""

from __future__ import annotations

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent_ledger import EffectLedger, EffectLedgerOptions, EffectStatus, MemoryStore
from agent_ledger.retries import failure_is_retryable


def _retried(part: object) -> bool:
    """A retry prompt, as pydantic-ai sends it for ``ModelRetry`` (a part of its own,
    or, in recent releases, a tool return whose outcome is ``"retried"``)."""
    return isinstance(part, RetryPromptPart) or getattr(part, "outcome", None) == "retried"


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    parts = messages[-1].parts
    if any(_retried(p) for p in parts):
        return ModelResponse(parts=[ToolCallPart("book", {"room": "blue"}, tool_call_id="c2")])
    returned = [p.content for p in parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"done: {returned}")])
    return ModelResponse(parts=[ToolCallPart("book", {"room": "blue"}, tool_call_id="c1")])


async def test_model_retry_runs_the_tool_again_without_the_adapter() -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    tries: list[str] = []

    @ledger.tool("rooms.book")
    async def book(room: str) -> str:
        """Book a room."""
        tries.append(room)
        if len(tries) == 1:
            raise ModelRetry("the room is busy, try again")
        return f"booked {room}"

    agent = Agent(FunctionModel(_script), tools=[book])
    async with ledger.workflow("w", turn="t1"):
        result = await agent.run("book blue")
    assert result.output == "done: ['booked blue']" and tries == ["blue", "blue"]
    (effect,) = (await ledger.list_effects(workflow_id="w")).effects
    assert effect.status is EffectStatus.SUCCEEDED and effect.executions == 2


def test_model_retry_and_its_subclasses_are_retryable_failures() -> None:
    class Busy(ModelRetry):
        pass

    assert failure_is_retryable(ModelRetry("again"), None)
    assert failure_is_retryable(Busy("again"), None)

    class ModelRetryLookalike(Exception):  # same name, not pydantic-ai's
        pass

    ModelRetryLookalike.__name__ = "ModelRetry"
    assert not failure_is_retryable(ModelRetryLookalike("x"), None)
