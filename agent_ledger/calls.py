"""What an agent asks for: a tool call, optionally naming the resource it acts on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from agent_ledger.effects import JSONValue
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.names import MAX_NAME_LENGTH, check_name_length

#: What makes two calls of a tool "the same call" (see ``agent_ledger.keys``):
#: ``"workflow"``: the workflow and the key's args, ever (the default);
#: ``"turn"``: those within one turn (``ledger.workflow(id, turn=...)``);
#: ``"call"``: one framework tool-call id (``call_id``).
Scope: TypeAlias = Literal["workflow", "turn", "call"]
#: The scopes, in the order the docs list them.
SCOPES: Final[tuple[Scope, ...]] = ("workflow", "turn", "call")


def check_scope(scope: object, field_name: str = "scope") -> Scope:
    """``scope`` if it names a scope; else ``EffectLedgerValidationError``."""
    if scope not in SCOPES or not isinstance(scope, str):
        raise EffectLedgerValidationError(
            f"{field_name} must be one of {', '.join(repr(s) for s in SCOPES)}, got {scope!r}",
            field=field_name,
        )
    return scope


def _require_text(value: object, field_name: str) -> None:
    if not isinstance(value, str):
        raise EffectLedgerValidationError(
            f"{field_name} must be a string, got {type(value).__name__}", field=field_name
        )
    if not value.strip():
        raise EffectLedgerValidationError(f"{field_name} must not be empty", field=field_name)
    if "\x00" in value:
        raise EffectLedgerValidationError(
            f"{field_name} must not contain U+0000 (NUL)", field=field_name
        )
    check_name_length(value, field_name)


@dataclass(frozen=True, slots=True)
class ResourceDescriptor:
    """The thing a call acts on, when that, not the args, is its identity.

    Two calls in one workflow with the same tool and the same descriptor are
    the same effect whatever their args, e.g. "create the issue for
    acme/app" stays one issue even if the generated body differs on retry.
    """

    namespace: str
    type: str
    id: Mapping[str, JSONValue]

    def __post_init__(self) -> None:
        _require_text(self.namespace, "resource.namespace")
        _require_text(self.type, "resource.type")
        if not isinstance(self.id, Mapping):
            raise EffectLedgerValidationError(
                f"resource.id must be a dict, got {type(self.id).__name__}", field="resource.id"
            )
        if not self.id:
            raise EffectLedgerValidationError("resource.id must not be empty", field="resource.id")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool invocation by an agent.

    ``args`` must be JSON (checked when the key is computed). ``call_id`` is
    the caller's own label for this invocation and is *not* part of the
    idempotency key. ``idempotency_keys`` names the args that identify the
    call when the rest may vary between retries (a timestamp, a generated
    message); see ``agent_ledger.keys`` for the exact rule.

    ``validate_keys`` names args (or ``"all"``) that a later call with the
    same key must repeat exactly: when an effect with this key already exists
    and its stored args differ in one of them, ``run()`` and ``begin()``
    raise ``EffectPayloadMismatchError`` at once (no waiting, no handler).
    Not part of the key.

    ``scope`` says what else is part of the key: nothing (``"workflow"``,
    the default: the same args in the same workflow are one effect, ever),
    the ``turn`` (``"turn"``: once per user request; when ``turn`` is None,
    ``run()`` takes the turn of ``ledger.workflow(id, turn=...)`` around it)
    or the ``call_id`` (``"call"``: once per framework tool-call id). A
    scope whose id is missing is refused when the key is computed. ``turn``
    is recorded with a new effect whatever the scope (so a later turn can
    tell it was answered from an earlier one's receipt).
    """

    workflow_id: str
    tool: str
    args: Mapping[str, JSONValue] = field(default_factory=dict)
    call_id: str | None = None
    resource: ResourceDescriptor | None = None
    idempotency_keys: Sequence[str] | None = None
    validate_keys: Sequence[str] | Literal["all"] | None = None
    scope: Scope = "workflow"
    turn: str | None = None

    def __post_init__(self) -> None:
        wf, tool = self.workflow_id, self.tool
        # The common case in one expression, no frame per field: two plain str
        # names, not blank, without NUL, within the length limit. Anything
        # else gets _require_text's verdict (and its message).
        if not (
            type(wf) is str
            and type(tool) is str
            and len(wf) <= MAX_NAME_LENGTH
            and len(tool) <= MAX_NAME_LENGTH
            and "\x00" not in wf
            and "\x00" not in tool
            and wf.strip()
            and tool.strip()
        ):
            _require_text(wf, "workflow_id")
            _require_text(tool, "tool")
        if type(self.args) is not dict:  # a plain dict skips the ABC check
            if not isinstance(self.args, Mapping):
                raise EffectLedgerValidationError(
                    f"args must be a dict, got {type(self.args).__name__}", field="args"
                )
            # Any mapping (an OrderedDict, a MappingProxy) is taken as a plain dict.
            object.__setattr__(self, "args", dict(self.args))
        if self.call_id is not None:
            _require_text(self.call_id, "call_id")
        if self.scope != "workflow":
            check_scope(self.scope)
        if self.turn is not None:
            _require_text(self.turn, "turn")
        if self.resource is not None and not isinstance(self.resource, ResourceDescriptor):
            raise EffectLedgerValidationError(
                f"resource must be a ResourceDescriptor, got {type(self.resource).__name__}",
                field="resource",
            )
        if self.idempotency_keys is not None:
            self._check_arg_names(self.idempotency_keys, "idempotency_keys")
            # Freeze it: a list could be changed after the key was computed.
            object.__setattr__(self, "idempotency_keys", tuple(self.idempotency_keys))
        if self.validate_keys is not None and self.validate_keys != "all":
            self._check_arg_names(self.validate_keys, "validate_keys")
            object.__setattr__(self, "validate_keys", tuple(self.validate_keys))

    def _check_arg_names(self, names: Sequence[str], what: str) -> None:
        if isinstance(names, str) or not isinstance(names, Sequence):
            extra = ' or "all"' if what == "validate_keys" else ""
            raise EffectLedgerValidationError(
                f"{what} must be a list of arg names{extra}, got {names!r}", field=what
            )
        if not names:
            raise EffectLedgerValidationError(
                f"{what} must not be empty (use None for the default)", field=what
            )
        for name in names:
            if not isinstance(name, str):
                raise EffectLedgerValidationError(
                    f"{what} entries must be strings, got {name!r}", field=what
                )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise EffectLedgerValidationError(
                f"{what} lists {duplicates} more than once", field=what
            )
        missing = [n for n in names if n not in self.args]
        if missing:
            raise EffectLedgerValidationError(
                f"{what} names {missing}, not present in args (args has {sorted(self.args)})",
                field=what,
            )
