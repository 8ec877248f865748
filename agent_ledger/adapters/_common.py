"""What every adapter does the same way: read a model's arguments, find the tool.

A model's tool call can be wrong in ways that are the model's to fix (JSON
that does not parse, a tool that does not exist, arguments that do not fit
the signature). Those raise ``MalformedToolCall`` before anything is
stored, with a message written for the model, so an adapter can hand it
back as the tool's result and let the model try again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent_ledger.errors import EffectLedgerValidationError

if TYPE_CHECKING:
    from agent_ledger.options import RunOptions
    from agent_ledger.tools import Tool, ToolLedger

__all__ = ["MalformedToolCall", "call_tool", "find_tool", "missing_extra", "parse_arguments"]


def missing_extra(module: str, needs: str, extra: str, note: str = "") -> ImportError:
    """The ImportError an adapter raises when its framework is not installed:
    what ``module`` needs and the extra that installs it (``note`` after it)."""
    hint = f'pip install "agent-ledger[{extra}]"'
    return ImportError(f"{module} needs {needs}: {hint}" + (f" {note}" if note else ""))


class MalformedToolCall(EffectLedgerValidationError):
    """A model's tool call that cannot be run as sent; nothing was stored.

    ``str(error)`` is meant for the model: what was wrong and what to send.
    """

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message, field="arguments")
        self.tool = tool


#: The integers a stored key can hold (orjson's range): signed or unsigned 64 bits.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


class _Refused(ValueError):
    """A JSON value the ledger cannot keep exactly."""


def _no_constant(name: str) -> object:
    raise _Refused(f"{name}, which is not JSON")


def _exact_int(text: str) -> int:
    """An integer kept exactly: one a float would round (so two values would share a key)
    is refused, never silently changed."""
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        raise _Refused(
            f"the integer {text[:40]}, beyond 64 bits (send it as a string if it is an id)"
        )
    return value


def parse_arguments(raw: str | bytes | Mapping[str, Any] | None, tool: str) -> dict[str, Any]:
    """A model's arguments as a dict: JSON text (OpenAI) or an already-decoded object.

    Empty text and None mean no arguments. Anything but a JSON object, or
    JSON with NaN/Infinity, integers beyond 64 bits (a float would merge two
    of them into one key), bad UTF-8 or absurd nesting, raises
    ``MalformedToolCall``. Integers are parsed exactly (the standard library's
    parser; orjson would turn big ones into floats).
    """
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, (str, bytes)):
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw, parse_constant=_no_constant, parse_int=_exact_int)
        except _Refused as exc:
            raise MalformedToolCall(
                f"the arguments for tool {tool!r} hold {exc}; send one JSON object with the "
                "tool's parameters by name",
                tool=tool,
            ) from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, too deep
            raise MalformedToolCall(
                f"the arguments for tool {tool!r} are not valid JSON ({exc}); send one JSON "
                "object with the tool's parameters by name",
                tool=tool,
            ) from None
        if isinstance(value, dict):
            return value
        raise MalformedToolCall(
            f"the arguments for tool {tool!r} must be a JSON object with the tool's "
            f"parameters by name, got {type(value).__name__}",
            tool=tool,
        )
    raise MalformedToolCall(
        f"the arguments for tool {tool!r} must be JSON text or an object, got {type(raw).__name__}",
        tool=tool,
    )


def find_tool(ledger: ToolLedger, name: str) -> Tool[Any]:
    """The tool registered on ``ledger`` as ``name``; ``MalformedToolCall`` if none is."""
    tool = ledger.tools.get(name) if isinstance(name, str) else None
    if tool is None:
        known = ", ".join(sorted(ledger.tools)) or "none"
        raise MalformedToolCall(f"there is no tool named {name!r}; the tools are: {known}")
    return tool


async def call_tool(
    ledger: ToolLedger,
    name: str,
    arguments: str | bytes | Mapping[str, Any] | None,
    *,
    call_id: str | None = None,
    run_options: RunOptions | None = None,
) -> object:
    """Run the named tool with a model's arguments: one ``Tool.invoke``.

    Raises ``MalformedToolCall`` (nothing stored) for unparseable arguments,
    an unknown tool or arguments that do not bind; otherwise returns or
    raises what ``Tool.invoke`` does (the tool's value, its exception,
    ``EffectDeniedError``, ``ApprovalPendingError``, ...).
    """
    tool = find_tool(ledger, name)
    values = parse_arguments(arguments, name)
    try:
        tool.bind_arguments(values)
    except EffectLedgerValidationError as exc:
        raise MalformedToolCall(str(exc), tool=name) from None
    return await tool.invoke(values, call_id=call_id, run_options=run_options)
