"""Type-checked by mypy (see pyproject), never run: the OpenAI and Anthropic adapters' types.

What the adapters return must fit straight into the SDKs' own request
parameters, so the one-line agent loop type-checks.
"""

from __future__ import annotations

from typing import assert_type

from anthropic.types import Message, MessageParam, ToolParam, ToolResultBlockParam
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionToolUnionParam,
)
from openai.types.responses import (
    FunctionToolParam,
    Response,
    ResponseInputItemParam,
)
from openai.types.responses import (
    ToolParam as ResponsesToolParam,
)
from openai.types.responses.response_input_item_param import FunctionCallOutput

from agent_ledger import EffectLedger
from agent_ledger.adapters import anthropic as anthropic_adapter
from agent_ledger.adapters import openai as openai_adapter


async def chat(ledger: EffectLedger, completion: ChatCompletion) -> None:
    messages: list[ChatCompletionMessageParam] = []
    answers = await openai_adapter.run_tool_calls(ledger, completion.choices[0].message.tool_calls)
    assert_type(answers, list[ChatCompletionToolMessageParam])
    messages += answers
    tools: list[ChatCompletionToolUnionParam] = []
    assert_type(openai_adapter.chat_tools(ledger), list[ChatCompletionFunctionToolParam])
    tools += openai_adapter.chat_tools(ledger, ["payments.charge"])


async def responses(ledger: EffectLedger, response: Response) -> None:
    input_items: list[ResponseInputItemParam] = []
    outputs = await openai_adapter.run_function_calls(ledger, response.output)
    assert_type(outputs, list[FunctionCallOutput])
    input_items += outputs
    tools: list[ResponsesToolParam] = []
    assert_type(openai_adapter.responses_tools(ledger), list[FunctionToolParam])
    tools += openai_adapter.responses_tools(ledger)


async def claude(ledger: EffectLedger, message: Message) -> None:
    results = await anthropic_adapter.run_tool_uses(
        ledger, message.content, wait_for_approval=False
    )
    assert_type(results, list[ToolResultBlockParam])
    reply: MessageParam = {"role": "user", "content": results}
    tools: list[ToolParam] = anthropic_adapter.tool_definitions(ledger)
    assert reply and tools is not None
