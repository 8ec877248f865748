"""A scripted LangChain chat model for the LangGraph tests: real LangChain, no network.

``ScriptedChat(reply)`` answers each call with ``reply(messages)`` (an
``AIMessage``) and counts its calls in ``calls``, a list shared by every
copy ``bind_tools`` makes, so a test sees how often the "provider" was
really called. Each reply reports 10 input and 5 output tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field

Reply = Callable[[list[BaseMessage]], AIMessage]


class ScriptedChat(BaseChatModel):
    """A chat model that answers from a script and counts its calls."""

    reply: Reply
    calls: list[list[BaseMessage]] = Field(default_factory=list)

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChat:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(list(messages))
        message = self.reply(list(messages))
        message.usage_metadata = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
        return ChatResult(generations=[ChatGeneration(message=message)])


def calls_tools(*calls: tuple[str, dict[str, Any]]) -> Reply:
    """A script: on a human message, call ``calls`` (ids made from the human message's id
    and the position); once tool results are in, say what they were."""

    def reply(messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, HumanMessage):
            turn = last.id or "t"
            return AIMessage(
                "",
                tool_calls=[
                    {"name": name, "args": args, "id": f"{turn}-{i}"}
                    for i, (name, args) in enumerate(calls)
                ],
            )
        return AIMessage("done: " + " | ".join(results_since_human(messages)))

    return reply


def results_since_human(messages: list[BaseMessage]) -> list[str]:
    """The tool results since the last human message, in order."""
    found: list[str] = []
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        if isinstance(message, ToolMessage):
            found.append(str(message.content))
    return found[::-1]
