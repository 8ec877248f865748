"""Anthropic: run a message's ``tool_use`` blocks through the ledger, hand back ``tool_result``s.

One line in the agent loop (see ``docs/adapters/anthropic.md``)::

    messages.append({"role": "user", "content": await run_tool_uses(ledger, message.content)})

Each ``tool_use`` block runs the registered tool of that name once per key
in the current workflow (``ledger.workflow(...)``); the block's id is
recorded as the effect's ``call_id`` and is never part of the key, so a
call the model repeats under a new id replays the first one's result.
Blocks of one message run concurrently and are answered in their order. A
result that is not a string is sent as JSON. Errors the model can fix
(an unknown tool, input that does not fit the signature or that the ledger
cannot keep, such as integers beyond 64 bits or NaN, the tool's own
exception or a result that is not JSON, a payload mismatch) come back as
``tool_result`` blocks with ``is_error: true``; a recorded failure reads
the same on the first call and every replay. A denial (a person said no,
or canceled the call before it ran) is that block's ``tool_result``, with
``is_error: true``, so the other blocks are answered. An effect canceled
after it started (``EffectDeniedError``: it may have taken effect), a
pending approval with ``wait_for_approval=False`` (``ApprovalPendingError``)
and the ledger's own errors are raised, after every block has settled.

``run_tool_uses_sync`` does the same for synchronous agent loops, on the
ledger's own event loop.

``tool_definitions`` describes the registered tools for ``tools=``: a
name the API accepts (``payments.charge`` is sent as ``payments_charge``),
the docstring, and an ``input_schema`` from the signature without ``effect``.
A call of that name runs that tool and no other: a name two registered
tools would both get (``payments.charge`` beside ``payments_charge``) is
refused when describing and when running.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agent_ledger.adapters._common import missing_extra
from agent_ledger.adapters._dispatch import Reply, blocking, call_of, dispatch, field
from agent_ledger.adapters._schema import described_tools
from agent_ledger.adapters._tokens import no_usage, token_count

try:
    from anthropic.types import Message, ToolParam, ToolResultBlockParam
except ImportError as exc:
    raise missing_extra(__name__, "the Anthropic SDK", "anthropic") from exc

from agent_ledger.effects import Usage
from agent_ledger.tools import LLMResult

if TYPE_CHECKING:
    from agent_ledger.ledger import EffectLedger
    from agent_ledger.options import RunOptions
    from agent_ledger.tools import Tool, ToolLedger

__all__ = ["llm_result", "run_tool_uses", "run_tool_uses_sync", "tool_definitions", "usage_of"]


async def run_tool_uses(
    ledger: EffectLedger,
    content: Iterable[object] | None,
    *,
    wait_for_approval: bool | None = None,
    run_options: RunOptions | None = None,
) -> list[ToolResultBlockParam]:
    """Run the ``tool_use`` blocks of ``content``; one ``tool_result`` block each.

    ``content`` is ``message.content``: the SDK's blocks or their dicts.
    Blocks of other types (text, thinking, server tools' calls) are
    skipped. Each result carries its block's ``tool_use_id``, in the
    blocks' order, so the list is the content of the next user message
    (tool results go first in it).

    ``wait_for_approval`` and ``run_options`` are the options every adapter
    takes, and its errors theirs too (see ``docs/adapters/anthropic.md``).
    """
    calls = [
        call_of(
            block,
            what="tool_use block",
            id_field="id",
            name=field(block, "name"),
            arguments=field(block, "input"),
        )
        for block in content or ()
        if field(block, "type") == "tool_use"
    ]
    return await dispatch(
        ledger, calls, _tool_result, run_options=run_options, wait_for_approval=wait_for_approval
    )


#: ``run_tool_uses`` for a synchronous agent loop: blocks until every call settled.
run_tool_uses_sync = blocking(run_tool_uses)


def tool_definitions(
    ledger: ToolLedger, tools: Iterable[Tool[Any] | str] | None = None
) -> list[ToolParam]:
    """``tools=[...]`` for ``tools`` (tools or names; default: all registered).

    Raises ``EffectLedgerValidationError`` for a name longer than 64
    characters, a name another registered tool (described or not) would
    also be called by the model, or a signature with no JSON schema.
    """
    definitions: list[ToolParam] = []
    for tool in described_tools(ledger, tools):
        definition: ToolParam = {"name": tool.name, "input_schema": tool.parameters}
        if tool.description is not None:
            definition["description"] = tool.description
        definitions.append(definition)
    return definitions


def _tool_result(reply: Reply) -> ToolResultBlockParam:
    block: ToolResultBlockParam = {
        "type": "tool_result",
        "tool_use_id": reply.call.call_id,
        "content": reply.content,
    }
    if reply.is_error:
        block["is_error"] = True
    return block


# -- model calls (ledger.llm) ---------------------------------------------------------


def usage_of(message: Message) -> Usage:
    """The tokens an Anthropic ``Message`` says it used, as a ``Usage`` (no price yet).

    Anthropic reports the prompt in three parts: ``input_tokens`` (after the
    last cache breakpoint), ``cache_creation_input_tokens`` and
    ``cache_read_input_tokens``. All three are input the model read, so they
    are added up here; a pricing callback that bills cache reads at their
    lower rate must be given the parts itself (from the recorded response).
    A message without usage, or an input or output count missing or null,
    counts as 0 tokens with a warning (absent cache parts are simply 0); a
    count that is not a whole number >= 0 raises
    ``EffectLedgerValidationError`` (the rule: ``adapters/_tokens.py``).
    """
    if not isinstance(message, Message):
        raise TypeError(f"usage_of() reads an anthropic Message, got {type(message).__name__}")
    usage = getattr(message, "usage", None)
    if usage is None:
        return no_usage("anthropic")
    read = token_count(getattr(usage, "input_tokens", None), sdk="anthropic", name="input_tokens")
    for part in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        value = getattr(usage, part, None)
        if value is not None:
            read += token_count(value, sdk="anthropic", name=part)
    wrote = token_count(
        getattr(usage, "output_tokens", None), sdk="anthropic", name="output_tokens"
    )
    return Usage(read, wrote)


def llm_result(message: Message) -> LLMResult:
    """An Anthropic ``Message`` as ``ledger.llm()`` records it: its JSON and its usage.

    ``await ledger.llm(lambda req: client.messages.create(**req),
    provider="anthropic", model=..., request=..., read=llm_result, pricing=...)``.
    """
    return LLMResult(response=message.model_dump(mode="json"), usage=usage_of(message))
