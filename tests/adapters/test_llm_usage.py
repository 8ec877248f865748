"""The adapters' model-call helpers read usage from the SDKs' own response objects.

Each response is a real SDK object, validated from the JSON its API sends
(no network); ``ledger.llm()`` then records it, priced, and a budget books it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from agent_ledger import (
    Budget,
    EffectLedgerValidationError,
    JSONValue,
    LLMResult,
    MemoryStore,
    Usage,
)
from agent_ledger.testing import build_ledger
from tests.lazy import lazy

if TYPE_CHECKING:
    import anthropic.types as anthropic_types
    import openai.types.chat as chat_types
    import openai.types.responses as responses_types
    from anthropic.types import Message

    from agent_ledger.adapters import anthropic as anthropic_adapter
    from agent_ledger.adapters import openai as openai_adapter
else:  # imported by the first test that runs, not at collection
    anthropic_types = lazy("anthropic.types")
    chat_types = lazy("openai.types.chat")
    responses_types = lazy("openai.types.responses")
    anthropic_adapter = lazy("agent_ledger.adapters.anthropic")
    openai_adapter = lazy("agent_ledger.adapters.openai")

CHAT: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}
RESPONSE: dict[str, Any] = {
    "id": "resp-1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-4o-mini",
    "output": [
        {
            "type": "message",
            "id": "msg-1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 20,
        "output_tokens": 7,
        "total_tokens": 27,
        "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 3},
    },
}
MESSAGE: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 30,
        "output_tokens": 9,
        "cache_creation_input_tokens": 4,
        "cache_read_input_tokens": 100,
    },
}


def test_openai_chat_completion_usage() -> None:
    completion = chat_types.ChatCompletion.model_validate(CHAT)
    assert openai_adapter.usage_of(completion) == Usage(12, 5)
    result = openai_adapter.llm_result(completion)
    assert result.usage == Usage(12, 5)
    assert result.response["choices"][0]["message"]["content"] == "hi"  # type: ignore[index,call-overload]


def test_openai_responses_usage() -> None:
    # Cached and reasoning tokens are already inside the two totals.
    assert openai_adapter.usage_of(responses_types.Response.model_validate(RESPONSE)) == Usage(
        20, 7
    )


def test_openai_response_without_usage_counts_nothing() -> None:
    completion = chat_types.ChatCompletion.model_validate({**CHAT, "usage": None})
    assert openai_adapter.usage_of(completion) == Usage()


def test_anthropic_message_usage_adds_the_cache_parts() -> None:
    message = anthropic_types.Message.model_validate(MESSAGE)
    assert anthropic_adapter.usage_of(message) == Usage(134, 9)
    assert anthropic_adapter.llm_result(message).response["id"] == "msg_1"  # type: ignore[index,call-overload]


def test_usage_of_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="anthropic Message"):
        anthropic_adapter.usage_of(chat_types.ChatCompletion.model_validate(CHAT))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ChatCompletion or Response"):
        openai_adapter.usage_of(anthropic_types.Message.model_validate(MESSAGE))  # type: ignore[arg-type]


async def test_a_recorded_sdk_response_is_priced_and_booked() -> None:
    ledger = build_ledger(MemoryStore())
    sent: list[object] = []

    async def create(**request: object) -> Message:  # stands in for client.messages.create
        sent.append(request)
        return anthropic_types.Message.model_validate(MESSAGE)

    def price(provider: str, model: str, usage: Usage) -> float:
        return usage.input_tokens * 3e-6 + usage.output_tokens * 15e-6

    request: dict[str, JSONValue] = {
        "model": "claude-sonnet",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with ledger.workflow("chat-1", budget=Budget(usd=1.0, output_tokens=100)):
        reply = await ledger.llm(
            lambda req: create(**req),
            provider="anthropic",
            model="claude-sonnet",
            request=request,
            read=anthropic_adapter.llm_result,
            pricing=price,
            estimate=Usage(200, 64),
        )
    assert len(sent) == 1 and sent[0] == request
    assert reply.usage is not None
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (134, 9)
    assert reply.usage.cost_usd == pytest.approx(134 * 3e-6 + 9 * 15e-6)
    assert reply.response["content"][0]["text"] == "hi"  # type: ignore[index,call-overload]
    state = await ledger.budget("chat-1")
    assert state is not None and (state.spent.input_tokens, state.spent.output_tokens) == (134, 9)
    assert isinstance(
        anthropic_adapter.llm_result(anthropic_types.Message.model_validate(MESSAGE)), LLMResult
    )


MESSAGE_NO_USAGE: dict[str, Any] = {k: v for k, v in MESSAGE.items() if k != "usage"}


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (None, Usage()),
        ({"prompt_tokens": 10, "total_tokens": 10}, Usage(10, 0)),
        ({"prompt_tokens": 10, "completion_tokens": None, "total_tokens": 10}, Usage(10, 0)),
        ({"prompt_tokens": 10.0, "completion_tokens": 5, "total_tokens": 15}, Usage(10, 5)),
    ],
)
def test_openai_missing_counts_are_zero_with_a_warning(
    usage: object, expected: Usage, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK builds API responses leniently (``construct``), as here: a count
    that is missing or null is 0 tokens, and the log says so."""
    completion = chat_types.ChatCompletion.construct(**{**CHAT, "usage": usage})
    assert openai_adapter.usage_of(completion) == expected
    if expected.output_tokens == 0:
        assert "counted as 0 tokens" in caplog.text


@pytest.mark.parametrize(
    ("usage", "expected", "warns"),
    [
        (None, Usage(), True),
        ({"input_tokens": 10}, Usage(10, 0), True),
        ({"input_tokens": None, "output_tokens": 3}, Usage(0, 3), True),
        (
            {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": None},
            Usage(10, 3),
            False,  # an absent cache part is simply none
        ),
    ],
)
def test_anthropic_missing_counts_are_zero_with_a_warning(
    usage: object, expected: Usage, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    message = anthropic_types.Message.construct(**{**MESSAGE_NO_USAGE, "usage": usage})
    assert anthropic_adapter.usage_of(message) == expected
    assert ("counted as 0 tokens" in caplog.text) is warns


@pytest.mark.parametrize("bad", [5.5, -1, "many"])
def test_a_count_that_is_not_a_whole_number_is_refused_by_both_adapters(bad: object) -> None:
    completion = chat_types.ChatCompletion.construct(
        **{**CHAT, "usage": {"prompt_tokens": 10, "completion_tokens": bad, "total_tokens": 1}}
    )
    with pytest.raises(EffectLedgerValidationError, match="completion_tokens"):
        openai_adapter.usage_of(completion)
    message = anthropic_types.Message.construct(
        **{**MESSAGE_NO_USAGE, "usage": {"input_tokens": bad, "output_tokens": 1}}
    )
    with pytest.raises(EffectLedgerValidationError, match="input_tokens"):
        anthropic_adapter.usage_of(message)
