"""What an agent asks for: a tool call, optionally naming the resource it acts on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent_ledger.effects import JSONValue
from agent_ledger.errors import EffectLedgerValidationError


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
    """

    workflow_id: str
    tool: str
    args: Mapping[str, JSONValue] = field(default_factory=dict)
    call_id: str | None = None
    resource: ResourceDescriptor | None = None
    idempotency_keys: Sequence[str] | None = None

    def __post_init__(self) -> None:
        _require_text(self.workflow_id, "workflow_id")
        _require_text(self.tool, "tool")
        if not isinstance(self.args, Mapping):
            raise EffectLedgerValidationError(
                f"args must be a dict, got {type(self.args).__name__}", field="args"
            )
        if type(self.args) is not dict:
            # Any mapping (an OrderedDict, a MappingProxy) is taken as a plain dict.
            object.__setattr__(self, "args", dict(self.args))
        if self.call_id is not None:
            _require_text(self.call_id, "call_id")
        if self.resource is not None and not isinstance(self.resource, ResourceDescriptor):
            raise EffectLedgerValidationError(
                f"resource must be a ResourceDescriptor, got {type(self.resource).__name__}",
                field="resource",
            )
        if self.idempotency_keys is not None:
            self._check_idempotency_keys(self.idempotency_keys)
            # Freeze it: a list could be changed after the key was computed.
            object.__setattr__(self, "idempotency_keys", tuple(self.idempotency_keys))

    def _check_idempotency_keys(self, names: Sequence[str]) -> None:
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise EffectLedgerValidationError(
                f"idempotency_keys must be a list of arg names, got {type(names).__name__}",
                field="idempotency_keys",
            )
        if not names:
            raise EffectLedgerValidationError(
                "idempotency_keys must not be empty (use None to key on all args)",
                field="idempotency_keys",
            )
        for name in names:
            if not isinstance(name, str):
                raise EffectLedgerValidationError(
                    f"idempotency_keys entries must be strings, got {name!r}",
                    field="idempotency_keys",
                )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise EffectLedgerValidationError(
                f"idempotency_keys lists {duplicates} more than once", field="idempotency_keys"
            )
        missing = [n for n in names if n not in self.args]
        if missing:
            raise EffectLedgerValidationError(
                f"idempotency_keys names {missing}, not present in args "
                f"(args has {sorted(self.args)})",
                field="idempotency_keys",
            )
