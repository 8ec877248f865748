"""Every adapter that takes a ``tools=`` list refuses a bad one with the same words.

``tool_definitions`` (Anthropic), ``chat_tools`` and ``responses_tools``
(OpenAI) and ``as_function_tools`` (OpenAI Agents SDK) choose a ledger's tools
through one function, so a string where a list was meant, an unknown name and
another ledger's tool are refused the same way by each, with ``field="tools"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from agent_ledger import EffectLedger, EffectLedgerValidationError, MemoryStore
from agent_ledger.testing import build_ledger
from tests.lazy import lazy

if TYPE_CHECKING:
    from agent_ledger.adapters import anthropic, openai, openai_agents
else:  # imported by the first test that runs, not at collection
    anthropic = lazy("agent_ledger.adapters.anthropic")
    openai = lazy("agent_ledger.adapters.openai")
    openai_agents = lazy("agent_ledger.adapters.openai_agents")

DESCRIBERS: dict[str, Callable[[EffectLedger, Any], object]] = {
    "anthropic.tool_definitions": lambda ledger, tools: anthropic.tool_definitions(ledger, tools),
    "openai.chat_tools": lambda ledger, tools: openai.chat_tools(ledger, tools),
    "openai.responses_tools": lambda ledger, tools: openai.responses_tools(ledger, tools),
    "openai_agents.as_function_tools": lambda ledger, tools: openai_agents.as_function_tools(
        ledger, tools
    ),
}


def _ledger() -> EffectLedger:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("mail.send")
    def send(to: str) -> str:
        """Send a mail."""
        return "sent"

    return ledger


@pytest.mark.parametrize("describe", DESCRIBERS.values(), ids=DESCRIBERS.keys())
def test_a_bad_tools_list_is_refused_with_one_wording(
    describe: Callable[[EffectLedger, Any], object],
) -> None:
    ledger = _ledger()
    stranger = _ledger().tools["mail.send"]
    refusals = {
        "mail.send": "tools must be a list of tool names or tools, got the string 'mail.send'",
        ("mail_send",): "there is no tool named 'mail_send' on this ledger (not a tool "
        "registered here); its tools are: mail.send",
        (stranger,): "tool 'mail.send' is registered on another ledger (not a tool "
        "registered here); its tools are: mail.send",
    }
    for tools, message in refusals.items():
        with pytest.raises(EffectLedgerValidationError) as info:
            describe(ledger, tools)
        assert str(info.value) == message
        assert info.value.field == "tools"
    # The same ledger's tools, by name or as objects, are accepted.
    assert len(describe(ledger, ["mail.send"])) == 1  # type: ignore[arg-type]
    assert len(describe(ledger, [ledger.tools["mail.send"]])) == 1  # type: ignore[arg-type]
