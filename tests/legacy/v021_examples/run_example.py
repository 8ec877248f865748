"""Run one of agent-ledger 0.2.1's examples, unchanged, as its users ran it.

``python run_example.py basic_usage`` runs ``basic_usage.py.txt`` as
``__main__``. ``python run_example.py openai_functions_agent`` runs the
OpenAI function-calling example's ``main()`` against a scripted model: the
example is loaded as a module (not ``__main__``, so it does not start on its
own), its ``AsyncOpenAI`` is replaced by :class:`ScriptedOpenAI`, and
``main()`` runs as written. Whichever ``agent_ledger`` is importable runs it
(this library in the test suite; 0.2.1 itself, to record what it printed).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def _tool_call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


#: What the scripted model answers, turn by turn: the three tools of the order,
#: then the same charge again (a model repeating itself, which the example's
#: ledger answers from its receipt), then the final text.
TURNS: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            _tool_call("call_1", "charge_customer", {"amount_cents": 7500}),
            _tool_call(
                "call_2",
                "send_email",
                {"to": "alice@example.com", "subject": "Order #42", "body": "Thanks!"},
            ),
            _tool_call(
                "call_3",
                "create_ticket",
                {"title": "Order #42", "description": "Follow up on order #42"},
            ),
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_tool_call("call_4", "charge_customer", {"amount_cents": 7500})],
    },
    {"role": "assistant", "content": "Order #42 is charged, confirmed and ticketed."},
]


class ScriptedOpenAI:
    """Stands in for ``openai.AsyncOpenAI``: answers ``chat.completions.create`` from
    :data:`TURNS`, as real ``ChatCompletion`` objects."""

    def __init__(self, **_: object) -> None:
        self.turns = iter(TURNS)
        self.chat = self
        self.completions = self

    async def create(self, **_: object) -> Any:
        from openai.types.chat import ChatCompletion

        return ChatCompletion.model_validate(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion",
                "created": 0,
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "finish_reason": "stop", "message": next(self.turns)}],
            }
        )


def main(name: str) -> None:
    source = (HERE / f"{name}.py.txt").read_text()
    if name == "basic_usage":
        exec(compile(source, f"{name}.py", "exec"), {"__name__": "__main__"})
        return
    os.environ.setdefault("OPENAI_API_KEY", "sk-scripted")
    namespace: dict[str, Any] = {"__name__": "v021_example"}
    exec(compile(source, f"{name}.py", "exec"), namespace)
    namespace["AsyncOpenAI"] = ScriptedOpenAI
    asyncio.run(namespace["main"]())


if __name__ == "__main__":
    main(sys.argv[1])
