"""What every adapter makes of a tool's signature: annotations, names, docstrings.

This module is written the usual way (``from __future__ import
annotations``, so every annotation is text), with some types imported only
for type checkers, which is where the adapters' schema builders used to
differ.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, EffectLedgerValidationError, MemoryStore
from agent_ledger.tools import Tool
from tests.lazy import lazy

if TYPE_CHECKING:
    import mcp as mcp_sdk
    import mcp.server.mcpserver as mcp_server

    from agent_ledger.adapters import anthropic, openai
    from agent_ledger.adapters import langchain as langchain_adapter
    from agent_ledger.adapters import mcp as mcp_adapter
    from agent_ledger.adapters import openai_agents as agents_adapter
else:  # imported by the first test that runs, not at collection
    mcp_sdk = lazy("mcp")
    mcp_server = lazy("mcp.server.mcpserver")
    anthropic = lazy("agent_ledger.adapters.anthropic")
    openai = lazy("agent_ledger.adapters.openai")
    langchain_adapter = lazy("agent_ledger.adapters.langchain")
    mcp_adapter = lazy("agent_ledger.adapters.mcp")
    agents_adapter = lazy("agent_ledger.adapters.openai_agents")

if TYPE_CHECKING:
    from decimal import Decimal  # never imported at run time

    from agent_ledger import Effect


def new_ledger() -> EffectLedger:
    return EffectLedger(EffectLedgerOptions(store=MemoryStore()))


def described(tool: Tool[object]) -> dict[str, object]:
    """What each adapter shows a model for ``tool``: its description and argument names."""
    (chat,) = openai.chat_tools(tool.ledger, [tool])
    (claude,) = anthropic.tool_definitions(tool.ledger, [tool])
    langchain = langchain_adapter.as_langchain_tool(tool)
    agents = agents_adapter.as_function_tool(tool)
    server = mcp_server.MCPServer("s")
    mcp_adapter.add_tool(server, tool, workflow_id="w")
    (listed,) = asyncio.run(server.list_tools())
    return {
        "openai": (
            chat["function"].get("description"),
            sorted(cast("dict[str, object]", chat["function"]["parameters"]["properties"])),
        ),
        "anthropic": (
            claude.get("description"),
            sorted(cast("dict[str, object]", claude["input_schema"]["properties"])),
        ),
        "langchain": (langchain.description, sorted(langchain.args)),
        "agents": (agents.description, sorted(agents.params_json_schema["properties"])),
        "mcp": (listed.description, sorted(listed.input_schema["properties"])),
    }


def test_effect_and_return_types_imported_for_type_checkers_only_are_never_evaluated() -> None:
    """Regression: chat_tools, tool_definitions and as_function_tool evaluated every
    annotation, and failed with NameError on `effect: Effect` (and a return type)
    imported under TYPE_CHECKING; LangChain and MCP did not."""
    ledger = new_ledger()

    @ledger.tool("mail.send")
    async def send(to: str, cc: list[str] | None = None, *, effect: Effect) -> Decimal:
        """Send a mail."""
        raise NotImplementedError

    assert described(send) == {
        adapter: ("Send a mail.", ["cc", "to"])
        for adapter in ("openai", "anthropic", "langchain", "agents", "mcp")
    }


def test_an_argument_type_that_does_not_resolve_is_refused_naming_the_parameter() -> None:
    """An argument's type is needed for its schema: every adapter refuses the tool with
    an error naming the tool and the parameter, and nothing is registered."""
    ledger = new_ledger()

    @ledger.tool("pay.charge")
    async def charge(order: str, amount: Decimal) -> str:
        raise NotImplementedError

    server = mcp_server.MCPServer("s")
    attempts: dict[str, Callable[[], object]] = {
        "openai": lambda: openai.chat_tools(ledger),
        "anthropic": lambda: anthropic.tool_definitions(ledger),
        "langchain": lambda: langchain_adapter.as_langchain_tool(charge),
        "agents": lambda: agents_adapter.as_function_tool(charge),
        "mcp": lambda: mcp_adapter.add_tool(server, charge, workflow_id="w"),
    }
    for adapter, attempt in attempts.items():
        with pytest.raises(EffectLedgerValidationError) as caught:
            attempt()
        assert "tool 'pay.charge'" in str(caught.value), adapter
        assert "'Decimal' of 'amount'" in str(caught.value), adapter
    assert asyncio.run(server.list_tools()) == []


def send_message(channel: str, text: str) -> str:
    """Post a message to a chat channel."""
    return f"{channel}: {text}"


def test_a_partial_is_described_by_the_function_it_wraps() -> None:
    """Regression: every adapter described a functools.partial tool with partial's own
    class docstring ("partial(func, *args, **keywords) - new function ...")."""
    ledger = new_ledger()
    post_ops = ledger.tool("chat.post_ops")(functools.partial(send_message, "ops"))
    assert described(post_ops) == {
        adapter: ("Post a message to a chat channel.", ["text"])
        for adapter in ("openai", "anthropic", "langchain", "agents", "mcp")
    }


def tool_with_parameter(ledger: EffectLedger, name: str) -> Tool[object]:
    """A tool whose one parameter is called ``name`` (not always a name ``def`` can spell)."""

    def fn(**kwargs: object) -> object:
        return kwargs

    parameter = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
    fn.__signature__ = inspect.Signature([parameter])  # type: ignore[attr-defined]
    return ledger.tool(f"odd.{name.strip('_')}")(fn)


@pytest.mark.parametrize("name", ["model_config", "_note", "config", "run_manager"])
def test_a_parameter_name_a_framework_cannot_carry_is_refused_when_wrapped(name: str) -> None:
    """Regression: LangChain converted tools with such a parameter and then failed every
    call blaming the model (the argument never arrived); MCP raised pydantic's or its own
    errors, the Agents SDK a TypeError. Each now refuses the tool naming the parameter;
    the OpenAI and Anthropic adapters take any name."""
    ledger = new_ledger()
    tool = tool_with_parameter(ledger, name)
    (chat,) = openai.chat_tools(ledger)
    assert list(cast("dict[str, object]", chat["function"]["parameters"]["properties"])) == [name]
    server = mcp_server.MCPServer("s")
    refusals: dict[str, Callable[[], object]] = {
        "LangChain": lambda: langchain_adapter.as_langchain_tool(tool),
        "MCP": lambda: mcp_adapter.add_tool(server, tool, workflow_id="w"),
        "the Agents SDK": lambda: agents_adapter.as_function_tool(tool),
    }
    langchain_only = name in ("config", "run_manager")
    for framework, attempt in refusals.items():
        if langchain_only and framework != "LangChain":
            attempt()  # only LangChain takes these names for itself
            continue
        with pytest.raises(EffectLedgerValidationError) as caught:
            attempt()
        assert f"{framework} cannot take a parameter named {name!r}" in str(caught.value)


async def test_names_only_langchain_reserves_work_elsewhere() -> None:
    """`config` is an ordinary argument for MCP and the Agents SDK: it arrives and keys."""
    ledger = new_ledger()
    tool = tool_with_parameter(ledger, "config")
    server = mcp_server.MCPServer("s")
    mcp_adapter.add_tool(server, tool, workflow_id="w")
    async with mcp_sdk.Client(server) as client:
        result = await client.call_tool("odd_config", {"config": "v"})
    assert not result.is_error
    assert [e.args for e in (await ledger.list_effects()).effects] == [{"config": "v"}]
