"""OpenAI: run a model's function calls through the ledger, hand back its results.

Two APIs, one behaviour (see ``docs/adapters/openai.md``)::

    # Chat Completions
    messages += await run_tool_calls(ledger, message.tool_calls)
    # Responses
    input_items += await run_function_calls(ledger, response.output)

Each function call runs the registered tool of that name once per key in
the current workflow (``ledger.workflow(...)``); the call's id is recorded
as the effect's ``call_id`` and is never part of the key, so a call the
model repeats under a new id replays the first one's result. Calls of one
turn run concurrently and are answered in their order. A result that is not
a string is sent as JSON. Errors the model can fix (malformed JSON, an
unknown tool, arguments that do not fit or that the ledger cannot keep,
such as integers beyond 64 bits, the tool's own exception or a result that
is not JSON, a payload mismatch) come back as results starting with
``Error:``; a recorded failure reads the same on the first call and every
replay. A denial (a person said no, or canceled the call before it ran) is
that call's result too, so the turn's other calls are answered. An effect
canceled after it started (``EffectDeniedError``: it may have taken effect),
a pending approval with ``wait_for_approval=False`` (``ApprovalPendingError``)
and the ledger's own errors are raised, after every call of the turn has settled.

``run_tool_calls_sync`` and ``run_function_calls_sync`` do the same for
synchronous agent loops, on the ledger's own event loop.

``chat_tools`` and ``responses_tools`` describe the registered tools for
the ``tools=`` parameter: a name the API accepts (``payments.charge`` is
sent as ``payments_charge``), the docstring, and a JSON schema of the
signature without ``effect``. A call of that name runs that tool and no
other: a name two registered tools would both get (``payments.charge``
beside ``payments_charge``) is refused when describing and when running.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agent_ledger.adapters._common import missing_extra
from agent_ledger.adapters._dispatch import ModelCall, Reply, blocking, call_of, dispatch, field
from agent_ledger.adapters._schema import described_tools
from agent_ledger.adapters._tokens import no_usage, token_count

try:
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionFunctionToolParam,
        ChatCompletionToolMessageParam,
    )
    from openai.types.responses import FunctionToolParam, Response
    from openai.types.responses.response_input_item_param import FunctionCallOutput
    from openai.types.shared_params import FunctionDefinition
except ImportError as exc:
    raise missing_extra(__name__, "the OpenAI SDK", "openai") from exc

from agent_ledger.effects import Usage
from agent_ledger.tools import LLMResult

if TYPE_CHECKING:
    from agent_ledger.ledger import EffectLedger
    from agent_ledger.options import RunOptions
    from agent_ledger.tools import Tool, ToolLedger

__all__ = [
    "chat_tools",
    "llm_result",
    "responses_tools",
    "run_function_calls",
    "run_function_calls_sync",
    "run_tool_calls",
    "run_tool_calls_sync",
    "usage_of",
]


async def run_tool_calls(
    ledger: EffectLedger,
    tool_calls: Iterable[object] | None,
    *,
    wait_for_approval: bool | None = None,
    run_options: RunOptions | None = None,
) -> list[ChatCompletionToolMessageParam]:
    """Run a Chat Completions message's ``tool_calls``; one ``role: "tool"`` message each.

    ``tool_calls`` is ``message.tool_calls`` (None gives ``[]``): the SDK's
    ``ChatCompletionMessageFunctionToolCall`` objects or their dicts. Custom
    tool calls (``type: "custom"``, free text) are not the ledger's and are
    skipped: answer them yourself. Each message carries its call's
    ``tool_call_id``, in the calls' order.

    ``wait_for_approval`` and ``run_options`` are the options every adapter
    takes, and its errors theirs too (see ``docs/adapters/openai.md``).
    """
    calls = [_chat_call(item) for item in tool_calls or ()]
    return await dispatch(
        ledger, calls, _tool_message, run_options=run_options, wait_for_approval=wait_for_approval
    )


async def run_function_calls(
    ledger: EffectLedger,
    items: Iterable[object] | None,
    *,
    wait_for_approval: bool | None = None,
    run_options: RunOptions | None = None,
) -> list[FunctionCallOutput]:
    """Run the Responses API's ``function_call`` items; one ``function_call_output`` each.

    ``items`` is ``response.output`` (or any list of items): the SDK's
    ``ResponseFunctionToolCall`` objects or their dicts, among others that
    are skipped (messages, reasoning, built-in tools' calls). Each output
    carries its call's ``call_id``, in the calls' order. The options and
    errors are ``run_tool_calls``'s.
    """
    calls = [_responses_call(item) for item in items or ()]
    return await dispatch(
        ledger,
        calls,
        _function_call_output,
        run_options=run_options,
        wait_for_approval=wait_for_approval,
    )


#: ``run_tool_calls`` for a synchronous agent loop: blocks until every call settled.
run_tool_calls_sync = blocking(run_tool_calls)
#: ``run_function_calls`` for a synchronous agent loop: blocks until every call settled.
run_function_calls_sync = blocking(run_function_calls)


def chat_tools(
    ledger: ToolLedger, tools: Iterable[Tool[Any] | str] | None = None
) -> list[ChatCompletionFunctionToolParam]:
    """Chat Completions ``tools=[...]`` for ``tools`` (tools or names; default: all registered).

    Raises ``EffectLedgerValidationError`` for a name longer than 64
    characters, a name another registered tool (described or not) would
    also be called by the model, or a signature with no JSON schema.
    """
    definitions: list[ChatCompletionFunctionToolParam] = []
    for tool in described_tools(ledger, tools):
        function: FunctionDefinition = {"name": tool.name, "parameters": tool.parameters}
        if tool.description is not None:
            function["description"] = tool.description
        definitions.append({"type": "function", "function": function})
    return definitions


def responses_tools(
    ledger: ToolLedger, tools: Iterable[Tool[Any] | str] | None = None
) -> list[FunctionToolParam]:
    """Responses API ``tools=[...]`` for ``tools``; as ``chat_tools``, in the Responses shape.

    ``strict`` is False: strict mode wants every parameter required, and a
    parameter with a default is optional here.
    """
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": False,
        }
        for tool in described_tools(ledger, tools)
    ]


def _chat_call(item: object) -> ModelCall | None:
    kind = field(item, "type")
    if kind is not None and kind != "function":
        return None
    function = field(item, "function")
    return call_of(
        item,
        what="Chat Completions tool call",
        id_field="id",
        name=field(function, "name"),
        arguments=field(function, "arguments"),
    )


def _responses_call(item: object) -> ModelCall | None:
    if field(item, "type") != "function_call":
        return None
    return call_of(
        item,
        what="Responses function call",
        id_field="call_id",
        name=field(item, "name"),
        arguments=field(item, "arguments"),
    )


def _tool_message(reply: Reply) -> ChatCompletionToolMessageParam:
    return {"role": "tool", "tool_call_id": reply.call.call_id, "content": reply.content}


def _function_call_output(reply: Reply) -> FunctionCallOutput:
    return {"type": "function_call_output", "call_id": reply.call.call_id, "output": reply.content}


# -- model calls (ledger.llm) ---------------------------------------------------------


def usage_of(response: ChatCompletion | Response) -> Usage:
    """The tokens an OpenAI response says it used, as a ``Usage`` (no price yet).

    Chat Completions report ``prompt_tokens``/``completion_tokens``, the
    Responses API ``input_tokens``/``output_tokens``; cached and reasoning
    tokens are already inside those totals. A response without ``usage``
    (a stream that did not ask for it), or a count missing or null, counts
    as 0 tokens with a warning: ask for usage
    (``stream_options={"include_usage": True}``) when a budget counts tokens.
    A count that is not a whole number >= 0 raises
    ``EffectLedgerValidationError`` (the rule: ``adapters/_tokens.py``).
    """
    if isinstance(response, ChatCompletion):
        names = ("prompt_tokens", "completion_tokens")
    elif isinstance(response, Response):
        names = ("input_tokens", "output_tokens")
    else:
        raise TypeError(
            f"usage_of() reads an openai ChatCompletion or Response, got {type(response).__name__}"
        )
    usage = getattr(response, "usage", None)
    if usage is None:
        return no_usage("openai")
    read, wrote = (
        token_count(getattr(usage, name, None), sdk="openai", name=name) for name in names
    )
    return Usage(read, wrote)


def llm_result(response: ChatCompletion | Response) -> LLMResult:
    """An OpenAI response as ``ledger.llm()`` records it: its JSON and its usage.

    ``await ledger.llm(lambda req: client.chat.completions.create(**req),
    provider="openai", model=..., request=..., read=llm_result, pricing=...)``.
    """
    return LLMResult(response=response.model_dump(mode="json"), usage=usage_of(response))
