"""Adapters: put the ledger between an agent framework and your tools, in one line.

One module per framework, each an optional extra that imports its SDK
only when that module is imported (``import agent_ledger`` never does):

* ``agent_ledger.adapters.openai``: Chat Completions ``tool_calls`` and
  Responses API function calls (extra ``openai``);
* ``agent_ledger.adapters.anthropic``: ``tool_use`` blocks (extra ``anthropic``);
* ``agent_ledger.adapters.openai_agents``: ``FunctionTool`` for the OpenAI
  Agents SDK (extra ``agents``);
* ``agent_ledger.adapters.langchain``: ``StructuredTool`` (extra ``langchain``);
* ``agent_ledger.adapters.mcp``: tools on an ``MCPServer`` (FastMCP before mcp 2;
  extra ``mcp``).

Every adapter dispatches to tools registered with ``@ledger.tool`` through
``Tool.invoke``: the framework's call id is recorded as the effect's
``call_id`` and is never part of the key, so a model that repeats a call
under a new id gets the first call's result.
"""

from __future__ import annotations

from agent_ledger.adapters._common import MalformedToolCall

__all__ = ["MalformedToolCall"]
