"""A ledger tool's arguments as a framework sees them: names, types, defaults.

Frameworks build a tool's input schema from a function signature. A ledger
tool's signature is the function's, less the keyword-only ``effect``
parameter, which the ledger passes and a model never sends. Annotations are
evaluated here (most modules write ``from __future__ import annotations``,
so they are strings), one parameter at a time: the ``effect`` annotation
may name a type imported only for type checkers, and it is never needed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.tools import EFFECT_PARAMETER

if TYPE_CHECKING:
    from agent_ledger.tools import Tool

__all__ = ["REQUIRED", "Argument", "arguments", "description", "return_annotation"]

#: ``Argument.default`` of a parameter without a default.
REQUIRED: Final = inspect.Parameter.empty


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
    """What a model reads about the tool: the function's docstring, cleaned, or ``""``."""
    return inspect.getdoc(tool.fn) or ""


def _evaluate(tool: Tool[Any], annotation: Any, where: str) -> Any:
    if not isinstance(annotation, str):
        return annotation
    target = inspect.unwrap(tool.fn)
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
