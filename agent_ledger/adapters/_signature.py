"""A ledger tool's arguments as a framework sees them: names, types, defaults.

Frameworks build a tool's input schema from a function signature. A ledger
tool's signature is the function's, less the keyword-only ``effect``
parameter, which the ledger passes and a model never sends. Annotations are
evaluated here (most modules write ``from __future__ import annotations``,
so they are strings), one parameter at a time: the ``effect`` annotation
may name a type imported only for type checkers, and it is never needed.

A framework that validates arguments (LangChain, MCP) turns the model's
JSON into Python objects: an enum member, a ``date``, a pydantic model. A
key is made of JSON, so ``JsonArguments`` turns them back, the way pydantic
writes them as JSON (an enum's value, ISO text for dates and times, a
model's fields as a dict, with only the fields that were sent). The tool
then receives that JSON, as it does from the OpenAI and Anthropic adapters
and from a direct call with the same values, and the key is the same.
``check_storable`` refuses, as the model's mistake, arguments a key cannot
hold (NaN, integers beyond 64 bits, over the ledger's size limit) before
anything is stored.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, create_model
from pydantic_core import PydanticSerializationError

from agent_ledger.adapters._common import MalformedToolCall
from agent_ledger.calls import ToolCall
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.tools import EFFECT_PARAMETER

if TYPE_CHECKING:
    from agent_ledger.tools import Tool

__all__ = [
    "REQUIRED",
    "Argument",
    "JsonArguments",
    "arguments",
    "check_storable",
    "description",
    "dressed",
    "name_for",
    "refuse_factories",
    "refuse_names",
    "return_annotation",
    "wrapped_function",
]

#: ``Argument.default`` of a parameter without a default.
REQUIRED: Final = inspect.Parameter.empty

_NOT_A_NAME: Final = re.compile(r"[^A-Za-z0-9_]")
#: What a framework's (or a model API's) tool name may not hold.
_NOT_IN_A_TOOL_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class Argument:
    """One argument a model sends: its name, its type (``Any`` if unannotated), its default."""

    name: str
    annotation: Any
    #: ``REQUIRED`` when the parameter has no default.
    default: Any


def arguments(tool: Tool[Any]) -> list[Argument]:
    """The tool's arguments in signature order, ``effect`` left out, annotations evaluated.

    Raises ``EffectLedgerValidationError`` naming the parameter whose
    annotation cannot be evaluated (a name imported only under
    ``TYPE_CHECKING``, say): a schema needs the real type.
    """
    found = []
    for param in tool.signature.parameters.values():
        if param.name == EFFECT_PARAMETER and param.kind is inspect.Parameter.KEYWORD_ONLY:
            continue
        annotation = Any if param.annotation is REQUIRED else param.annotation
        found.append(Argument(param.name, _evaluate(tool, annotation, param.name), param.default))
    return found


def refuse_names(tool: Tool[Any], framework: str, reserved: Mapping[str, str] = {}) -> None:
    """Raise ``EffectLedgerValidationError`` for a parameter name ``framework`` cannot carry.

    Frameworks build a pydantic model of the arguments, and pydantic drops a
    name starting with ``_`` (private) and refuses ``model_config``; some
    frameworks take other names for themselves (``reserved``: name to why).
    Such a tool would convert, then fail every call blaming the model (the
    argument never arrives), so it is refused when it is wrapped, naming the
    parameter. The OpenAI and Anthropic adapters take any name.
    """
    for param in tool.signature.parameters.values():
        name = param.name
        if name == EFFECT_PARAMETER and param.kind is inspect.Parameter.KEYWORD_ONLY:
            continue
        if name.startswith("_"):
            why = "pydantic, which builds its schema, takes a name starting with '_' as private"
        elif name == "model_config":
            why = "pydantic, which builds its schema, keeps that name for a model's settings"
        else:
            why = reserved.get(name, "")
        if why:
            raise EffectLedgerValidationError(
                f"tool {tool.name!r}: {framework} cannot take a parameter named {name!r} "
                f"({why}), so no call could pass it; rename the parameter",
                field="fn",
            )


def name_for(tool_name: str) -> str:
    """``tool_name`` as frameworks and model APIs take a tool's name: each character
    other than letters, digits, ``_`` and ``-`` as ``_``."""
    return _NOT_IN_A_TOOL_NAME.sub("_", tool_name)


def dressed(
    fn: Callable[..., Any], name: str, doc: str | None, signature: inspect.Signature
) -> Callable[..., Any]:
    """``fn``, named ``name``, documented by ``doc`` and showing ``signature``: a
    framework builds a tool's name, description and schema from its function."""
    shown: Any = fn
    shown.__signature__ = signature
    shown.__name__ = shown.__qualname__ = name
    shown.__doc__ = doc
    return fn


def refuse_factories(schema: type[BaseModel], what: str, framework: str, field: str) -> None:
    """Raise ``EffectLedgerValidationError`` for a field of ``schema`` with a ``default_factory``.

    ``framework`` validates a call's arguments against ``schema`` before the
    ledger makes the key, filling such a field with a fresh value on every
    run: no two calls would share a key, and every repeat would run again.
    ``what`` names the tool in the message, ``field`` is the error's field.
    """
    made = sorted(n for n, f in schema.model_fields.items() if f.default_factory is not None)
    if made:
        raise EffectLedgerValidationError(
            f"{what} has arguments with a default_factory ({made}): {framework} fills them "
            "with a new value on every run, before the ledger makes the key, so a repeated "
            "call would get a new key and run again. Give them a plain default (or none), "
            "or make the value inside the tool.",
            field=field,
        )


def return_annotation(tool: Tool[Any]) -> Any:
    """The tool function's evaluated return annotation, or ``REQUIRED`` if it has none
    or it cannot be evaluated (a schema for the result is optional)."""
    annotation = tool.signature.return_annotation
    if annotation is inspect.Signature.empty:
        return REQUIRED
    try:
        return _evaluate(tool, annotation, "return")
    except EffectLedgerValidationError:
        return REQUIRED


def description(tool: Tool[Any]) -> str:
    """What a model reads about the tool: the function's docstring, cleaned, or ``""``.

    The function's, not a wrapper's: a tool registered from
    ``functools.partial(send, "ops")`` is described by ``send``'s docstring,
    not by ``partial``'s own ("partial(func, *args, **keywords) - new
    function..."). Every adapter describes a tool with this.
    """
    return inspect.getdoc(wrapped_function(tool)) or ""


def wrapped_function(tool: Tool[Any]) -> Any:
    """The function underneath ``tool.fn``: partials and ``functools.wraps`` wrappers undone.

    Its docstring describes the tool and its module's globals resolve the
    annotations written as text.
    """
    fn: Any = tool.fn
    for _ in range(100):  # a cycle of wrappers is not followed for ever
        if isinstance(fn, (functools.partial, functools.partialmethod)):
            fn = fn.func
        elif callable(getattr(fn, "__wrapped__", None)):
            fn = fn.__wrapped__
        else:
            break
    return fn


def _evaluate(tool: Tool[Any], annotation: Any, where: str) -> Any:
    if not isinstance(annotation, str):
        return annotation
    target = wrapped_function(tool)
    namespace = getattr(target, "__globals__", None)
    if namespace is None:
        module = inspect.getmodule(target)
        namespace = vars(module) if module is not None else {}
    try:
        # What typing.get_type_hints does for each annotation, one at a time.
        return eval(annotation, namespace)
    except Exception as exc:
        raise EffectLedgerValidationError(
            f"tool {tool.name!r}: cannot evaluate the annotation {annotation!r} of "
            f"{where!r} ({type(exc).__name__}: {exc}); a framework's schema needs the real "
            "type, so import it at module level",
            field="fn",
        ) from None


class JsonArguments:
    """Arguments a framework validated into Python objects, back to JSON values.

    Built once per tool from each argument's type (``types``: name to
    annotation). Calling it gives the arguments as pydantic writes them in
    JSON mode: an enum as its value, a ``date``/``datetime`` as ISO text, a
    model as a dict of the fields that were set (defaults the model did not
    send are left out, as they are from the JSON a model sends to the other
    adapters), NaN and integers beyond 64 bits kept as they are so that
    ``check_storable`` refuses them. Names it does not know pass unchanged
    (the binding refuses them).
    """

    __slots__ = ("_fields", "_model")

    def __init__(self, tool_name: str, types: Mapping[str, Any]) -> None:
        # Fields under neutral names: an argument may be called `json` or
        # `copy`, which a pydantic model's field may not.
        self._fields = {name: f"a{i}" for i, name in enumerate(types)}
        config = ConfigDict(arbitrary_types_allowed=True, ser_json_inf_nan="constants")
        fields: dict[str, Any] = {self._fields[n]: (t, None) for n, t in types.items()}
        self._model: type[BaseModel] = create_model(
            f"{_NOT_A_NAME.sub('_', tool_name)}_json", __config__=config, **fields
        )

    def __call__(self, values: Mapping[str, Any], tool_name: str) -> dict[str, Any]:
        known = {self._fields[k]: v for k, v in values.items() if k in self._fields}
        instance = self._model.model_construct(_fields_set=set(known), **known)
        try:
            dumped = self._model.__pydantic_serializer__.to_python(
                instance, mode="json", exclude_unset=True, warnings=False
            )
        except PydanticSerializationError as exc:
            raise EffectLedgerValidationError(
                f"tool {tool_name!r}: an argument has no JSON form ({exc}); annotate the "
                "tool's parameters with JSON types, enums, dates or pydantic models",
                field="args",
            ) from None
        names = {field: name for name, field in self._fields.items()}
        found = {names[field]: value for field, value in dumped.items()}
        found.update((k, v) for k, v in values.items() if k not in self._fields)
        return found


def check_storable(tool: Tool[Any], values: Mapping[str, object]) -> None:
    """Raise ``MalformedToolCall`` if a key cannot be made of ``values`` (bound arguments).

    What the key checks, asked before the call so that it reads as the
    model's mistake and nothing is stored: JSON values only (no NaN or
    Infinity, integers within 64 bits, text without lone surrogates) and
    the ledger's ``max_args_size_bytes``.
    """
    call = ToolCall(
        workflow_id="-",  # any: only the arguments are checked
        tool=tool.name,
        args=dict(values),  # type: ignore[arg-type]  # checked here
        idempotency_keys=tool.idempotency_keys,
        validate_keys=tool.validate_keys,
    )
    try:
        tool.ledger.idem_key(call)
    except EffectLedgerValidationError as exc:
        raise MalformedToolCall(
            f"the arguments for tool {tool.name!r} cannot be recorded: {exc}. Nothing ran and "
            "nothing was stored; send JSON values (no NaN or Infinity, integers within 64 "
            "bits: send a larger one as a string), and pass large content by reference.",
            tool=tool.name,
        ) from None
