"""What a model is told about a tool: a name it may use, a description, a JSON schema.

Every framework describes a tool the same way underneath: a name, some
text, and a JSON schema of an object whose properties are the arguments.
This module derives all three from the registered ``Tool`` once, so each
adapter only wraps them in its SDK's shape.

* **Name.** Model APIs accept ``[A-Za-z0-9_-]{1,64}``; a ledger name such as
  ``payments.charge`` is sent as ``payments_charge``. ``find_model_tool``
  maps it back. The ledger's name, not this one, goes into keys. A name
  the model is offered must lead back to that tool and no other, so a
  tool is not described while any registered tool (offered or not) has
  the same model name (``payments.charge`` beside ``payments_charge``),
  and a call by a name two tools share is refused, never guessed.
* **Schema.** Built with pydantic (which the SDKs bring) from the
  signature's annotations; ``effect`` is left out, a parameter with a
  default is optional and shows the default, no annotation means any JSON.
  ``Annotated[int, Field(description=...)]`` describes a parameter.
  Unknown properties are refused (``additionalProperties: false``), as
  the tool's binding refuses them.

The schema describes; it does not check. A call's arguments are bound by
name (unknown, missing or repeated ones are refused) and stored as sent:
a tool annotated ``amount: int`` receives whatever JSON the model put there.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, NamedTuple, NotRequired, cast

import orjson

from agent_ledger.adapters._common import MalformedToolCall
from agent_ledger.adapters._signature import REQUIRED, arguments, description, name_for
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.tools import Tool

try:
    import pydantic
    from typing_extensions import TypedDict
except ImportError as exc:  # pragma: no cover - every adapter extra brings pydantic
    raise ImportError(
        "agent-ledger's adapters build tool schemas with pydantic, which every adapter's "
        'extra installs: pip install "agent-ledger[openai]" (or anthropic, langchain, mcp, '
        "agents)"
    ) from exc

if TYPE_CHECKING:
    from agent_ledger.tools import ToolLedger

__all__ = [
    "Described",
    "chosen_tools",
    "described_tools",
    "find_model_tool",
    "model_name",
    "parameters_schema",
    "selected_tools",
    "tool_description",
]

#: What OpenAI and Anthropic accept as a function or tool name.
MODEL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

#: Each tool's schema, built once, kept as JSON so every caller gets its own copy.
_SCHEMAS: weakref.WeakKeyDictionary[Tool[Any], bytes] = weakref.WeakKeyDictionary()
#: Each tool's model name (None: too long), worked out once.
_MODEL_NAMES: weakref.WeakKeyDictionary[Tool[Any], str | None] = weakref.WeakKeyDictionary()


def model_name(tool: Tool[Any]) -> str:
    """The name the model sees for ``tool``: its own, other characters as ``_``.

    Raises ``EffectLedgerValidationError`` for a name longer than 64
    characters: cutting it could make two tools one.
    """
    name = name_for(tool.name)
    if not MODEL_NAME.fullmatch(name):
        raise EffectLedgerValidationError(
            f"tool {tool.name!r}: model APIs take tool names of at most 64 characters "
            f"({len(name)} here); register it under a shorter name",
            field="name",
        )
    return name


def find_model_tool(ledger: ToolLedger, name: object) -> Tool[Any]:
    """The tool a model means by ``name``: the one whose model name it is.

    A name no tool is described as (``payments.charge``: the API would not
    take it) reaches the tool registered under it. Raises
    ``MalformedToolCall`` (a message for the model) if no tool answers to
    the name, and ``EffectLedgerValidationError`` (the application's to fix:
    rename one) if two do, say ``payments.charge`` and ``payments_charge``
    for ``payments_charge``: running either could run the wrong one.
    """
    if isinstance(name, str):
        matches = (
            [t for t in ledger.tools.values() if _safe_model_name(t) == name]
            if MODEL_NAME.fullmatch(name)
            else []
        )
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise EffectLedgerValidationError(
                f"the model called the tool {name!r}, and tools "
                f"{sorted(t.name for t in matches)} are all called that by the model, so "
                "which one it meant is unknown; nothing was run. Rename one of them",
                field="name",
            )
        tool = ledger.tools.get(name)
        if tool is not None:
            return tool
    known = sorted(n for n in map(_safe_model_name, ledger.tools.values()) if n)
    raise MalformedToolCall(
        f"there is no tool named {name!r}; the tools are: {', '.join(known) or 'none'}",
        tool=name if isinstance(name, str) else None,
    )


def _safe_model_name(tool: Tool[Any]) -> str | None:
    """``model_name(tool)``, None for a name too long; remembered per tool."""
    try:
        return _MODEL_NAMES[tool]
    except KeyError:
        pass
    try:
        name: str | None = model_name(tool)
    except EffectLedgerValidationError:
        name = None
    _MODEL_NAMES[tool] = name
    return name


def chosen_tools(ledger: ToolLedger, tools: Iterable[Tool[Any] | str] | None) -> list[Tool[Any]]:
    """``tools`` (tools or registered names) as this ledger's tools, in order; all when None.

    Refuses a bare string (a name where a list was meant), an unknown name
    and a tool this ledger did not register, naming the ledger's tools.
    """
    if tools is None:
        return list(ledger.tools.values())
    if isinstance(tools, str):
        raise EffectLedgerValidationError(
            f"tools must be a list of tool names or tools, got the string {tools!r}",
            field="tools",
        )
    chosen: list[Tool[Any]] = []
    for item in tools:
        tool = ledger.tools.get(item) if isinstance(item, str) else item
        if isinstance(tool, Tool) and ledger.tools.get(tool.name) is tool:
            chosen.append(tool)
            continue
        known = ", ".join(sorted(ledger.tools)) or "none"
        if isinstance(item, Tool):
            refused = f"tool {item.name!r} is registered on another ledger"
        else:
            refused = f"there is no tool named {item!r} on this ledger"
        raise EffectLedgerValidationError(
            f"{refused} (not a tool registered here); its tools are: {known}", field="tools"
        )
    return chosen


def selected_tools(ledger: ToolLedger, tools: Iterable[Tool[Any] | str] | None) -> list[Tool[Any]]:
    """The tools to describe: ``chosen_tools``, refusing also a tool whose model
    name is another registered tool's too (chosen or not)."""
    chosen = chosen_tools(ledger, tools)
    # Every registered tool, not only the chosen ones: a call comes back by
    # name, and a tool the model was not offered would answer to it too.
    owners: dict[str, list[str]] = {}
    for tool in ledger.tools.values():
        name = _safe_model_name(tool)
        if name is not None:
            owners.setdefault(name, []).append(tool.name)
    for tool in chosen:
        name = model_name(tool)
        others = [other for other in owners.get(name, ()) if other != tool.name]
        if others:
            raise EffectLedgerValidationError(
                f"tools {tool.name!r} and {others[0]!r} would both be called {name!r} by "
                "the model, so a call of that name could run either; rename one (both are "
                "registered, whichever of them you describe)",
                field="tools",
            )
    return chosen


class Described(NamedTuple):
    """A tool as a model API describes it: the name it calls, its arguments' schema, its doc."""

    name: str
    parameters: dict[str, Any]
    description: str | None


def described_tools(ledger: ToolLedger, tools: Iterable[Tool[Any] | str] | None) -> list[Described]:
    """Each of ``selected_tools`` as a model API describes it, in order."""
    return [
        Described(model_name(tool), parameters_schema(tool), tool_description(tool))
        for tool in selected_tools(ledger, tools)
    ]


def tool_description(tool: Tool[Any]) -> str | None:
    """The function's docstring, cleaned of indentation; None without one.

    The wrapped function's for a partial (``_signature.description``).
    """
    return description(tool) or None


def parameters_schema(tool: Tool[Any]) -> dict[str, Any]:
    """The JSON schema (an object) of ``tool``'s arguments, a fresh copy on each call."""
    cached = _SCHEMAS.get(tool)
    if cached is None:
        cached = _SCHEMAS[tool] = orjson.dumps(_build_schema(tool))
    schema: dict[str, Any] = orjson.loads(cached)
    return schema


def _build_schema(tool: Tool[Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    defaults: dict[str, object] = {}
    # The annotations as types, one parameter at a time (`from __future__ import
    # annotations` makes them text): `effect`'s and the return's are never
    # evaluated, so they may name types imported only for type checkers.
    for argument in arguments(tool):
        if argument.default is REQUIRED:
            fields[argument.name] = argument.annotation
        else:
            fields[argument.name] = NotRequired[argument.annotation]
            defaults[argument.name] = argument.default
    # A TypedDict rather than a model: any parameter name works as a key (a
    # model's fields may not be called `model_config` or `json`). It is
    # typing_extensions' (pydantic wants that one before Python 3.12), called
    # through Any: mypy checks the functional form only with literal arguments.
    typed = cast(Any, TypedDict)(f"{tool.name}.arguments", fields)
    typed.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")
    try:
        schema: dict[str, Any] = pydantic.TypeAdapter(typed).json_schema()
    except pydantic.PydanticUserError as exc:
        raise EffectLedgerValidationError(
            f"tool {tool.name!r}: its parameters have no JSON schema ({exc}); annotate "
            "them with JSON types (str, int, float, bool, None, lists, dicts, Literal, "
            "TypedDict or pydantic models)",
            field="fn",
        ) from exc
    schema.pop("title", None)
    properties: dict[str, dict[str, Any]] = schema.setdefault("properties", {})
    for name, prop in properties.items():
        prop.pop("title", None)  # "Order Id" for order_id: noise for the model
        if name in defaults:
            prop["default"] = defaults[name]
    return schema
