"""Canonical JSON and the idempotency key: what makes two calls "the same".

The key is the SHA-256 hex digest of the canonical JSON of a five-element
array::

    ["agent-ledger/v1", workflow_id, tool, mode, identity]

where ``mode`` and ``identity`` are, by precedence:

* ``"resource"`` and ``{"id": ..., "namespace": ..., "type": ...}`` when the
  call has a ``ResourceDescriptor``;
* ``"args_subset"`` and the object of just the args named in
  ``idempotency_keys`` when it has those;
* ``"args"`` and all the args otherwise.

Canonical JSON means: UTF-8, object keys sorted by code point, no
whitespace, the JSON data model only (objects with string keys, arrays,
strings, finite floats, integers within 64 bits, true/false/null); tuples
encode as arrays. Strings may hold any character but lone surrogates
(which UTF-8 cannot encode); U+0000 is written as the JSON escape
``\\u0000``, so the text every store keeps has no NUL byte in it. So two
calls are the same effect exactly when their workflow, tool, mode and
identity are equal as JSON values: dict order does not matter, ``1`` and
``1.0`` differ, ``call_id`` is ignored (unless the scope is ``"call"``).

A call whose ``scope`` is ``"turn"`` or ``"call"`` (see ``ToolCall``) adds a
sixth element naming its scope and that scope's id::

    ["agent-ledger/v1", workflow_id, tool, mode, identity, ["turn", turn]]
    ["agent-ledger/v1", workflow_id, tool, mode, identity, ["call", call_id]]

so the same args in another turn (or under another tool-call id) are another
effect. ``scope="workflow"`` (the default) adds nothing: its keys are
byte-for-byte the keys of every earlier release, and a five-element array
never encodes like a six-element one. A ``"turn"`` call without a turn, or a
``"call"`` call without a ``call_id``, has no key:
``EffectLedgerValidationError``, never a silent fallback to the workflow.

Because every part is a complete JSON value inside a JSON array, no choice of
strings can make two different calls encode alike (a ``"|"`` or ``","`` in a
workflow id is escaped or quoted, never a separator), and the version tag
lets a future encoding change without silently colliding with this one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Final, Literal, NamedTuple

import orjson

from agent_ledger.calls import ToolCall
from agent_ledger.errors import EffectLedgerValidationError

KEY_VERSION: Final = "agent-ledger/v1"
DEFAULT_MAX_ARGS_SIZE_BYTES: Final = 1024 * 1024

# Deeper structures than this are almost certainly a bug (and orjson refuses
# them anyway); checking first gives a clear error instead of a RecursionError.
MAX_DEPTH: Final = 128
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1


class _NotJSON(Exception):
    """Internal: carries the reason and, while unwinding, the path to the value."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.path: list[str] = []


def _check(value: object, depth: int) -> None:
    # Exact type checks on purpose: str/int subclasses (enums, custom types)
    # would encode in ways that depend on the library version.
    kind = type(value)
    if kind is str:
        return
    if kind is bool or value is None:
        return
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:  # type: ignore[operator]
            raise _NotJSON(f"integer {value} does not fit in 64 bits")
        return
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise _NotJSON(f"{value} is not allowed (JSON has no NaN or Infinity)")
        return
    if depth >= MAX_DEPTH:
        raise _NotJSON(f"nested deeper than {MAX_DEPTH} levels")
    # Containers: the common scalars are accepted inline, which saves a call
    # per value on the hot path; anything else recurses (and reports its path).
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise _NotJSON(f"object key {key!r} is a {type(key).__name__}, keys must be str")
            # _plain_scalar, inline: the args of almost every call are flat.
            item_kind = type(item)
            if (
                item_kind is str
                or item is None
                or item_kind is bool
                or (item_kind is int and _INT_MIN <= item <= _INT_MAX)
            ):
                continue
            try:
                _check(item, depth + 1)
            except _NotJSON as exc:
                exc.path.append(f"[{key!r}]")
                raise
        return
    if kind is list or kind is tuple:
        for index, item in enumerate(value):  # type: ignore[arg-type]
            if _plain_scalar(item):
                continue
            try:
                _check(item, depth + 1)
            except _NotJSON as exc:
                exc.path.append(f"[{index}]")
                raise
        return
    raise _NotJSON(
        f"{kind.__name__} is not a JSON value (use dict, list, str, int, float, bool or None)"
    )


def _plain_scalar(item: object) -> bool:
    """True for values that are certainly valid: str, bool, None, 64-bit int.

    A str may still hold a lone surrogate, which orjson refuses when encoding.
    """
    kind = type(item)
    return (
        kind is str
        or item is None
        or kind is bool
        or (kind is int and _INT_MIN <= item <= _INT_MAX)  # type: ignore[operator]
    )


def canonical_json(value: object, *, field: str, sort_keys: bool = True) -> bytes:
    """Encode ``value`` as canonical JSON, or raise naming ``field`` and the bad spot.

    >>> canonical_json({"b": 1, "a": [True, None]}, field="args")
    b'{"a":[true,null],"b":1}'
    """
    try:
        _check(value, 0)
    except _NotJSON as exc:
        where = field + "".join(reversed(exc.path))
        raise EffectLedgerValidationError(f"{where}: {exc.reason}", field=field) from None
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except orjson.JSONEncodeError as exc:
        # What the walk above cannot see cheaply, e.g. lone surrogates in a str.
        raise EffectLedgerValidationError(f"{field}: {exc}", field=field) from None


class CanonicalCall(NamedTuple):
    """A call reduced to what the store records: its key and canonical texts.

    A NamedTuple rather than a dataclass: it is built on every ``run()``.
    """

    idem_key: str
    args_canonical: str
    resource_id_canonical: str | None


def canonicalize(
    call: ToolCall, max_args_size_bytes: int = DEFAULT_MAX_ARGS_SIZE_BYTES
) -> CanonicalCall:
    """Validate ``call``'s args and compute its idempotency key (see module doc)."""
    args = canonical_json(call.args, field="args")
    if len(args) > max_args_size_bytes:
        raise EffectLedgerValidationError(
            f"args are {len(args)} bytes as canonical JSON, over max_args_size_bytes="
            f"{max_args_size_bytes}; store large payloads elsewhere and pass a reference",
            field="args",
        )
    resource_canonical: str | None = None
    if call.resource is not None:
        mode = b"resource"
        identity = canonical_json(
            {
                "namespace": call.resource.namespace,
                "type": call.resource.type,
                "id": dict(call.resource.id),
            },
            field="resource",
        )
        resource_canonical = identity.decode()
    elif call.idempotency_keys is not None:
        mode = b"args_subset"
        # Already validated as part of args: only encoding is left.
        identity = orjson.dumps(
            {name: call.args[name] for name in call.idempotency_keys},
            option=orjson.OPT_SORT_KEYS,
        )
    else:
        mode = b"args"
        identity = args
    try:
        # The array's first three elements in one encoding, its "]" cut off.
        head = orjson.dumps((KEY_VERSION, call.workflow_id, call.tool))[:-1]
    except orjson.JSONEncodeError:
        _encode_text(call.workflow_id, "workflow_id")
        _encode_text(call.tool, "tool")
        raise  # not reached: one of the two raised, naming its field
    material = b'%s,"%s",%s%s]' % (
        head,
        mode,
        identity,
        b"" if call.scope == "workflow" else _scope_part(call),
    )
    return CanonicalCall(hashlib.sha256(material).hexdigest(), args.decode(), resource_canonical)


def _scope_part(call: ToolCall) -> bytes:
    """The key's sixth element for a ``"turn"`` or ``"call"`` scope (with its comma)."""
    if call.scope == "turn":
        if call.turn is None:
            raise EffectLedgerValidationError(
                f"tool {call.tool!r} has scope='turn', and no turn is known for this call: "
                f"call it inside `ledger.workflow({call.workflow_id!r}, turn=...)` (an adapter "
                "derives the turn from its framework), or give ToolCall(turn=...). "
                "Nothing was stored.",
                field="turn",
            )
        return b',["turn",%s]' % _encode_text(call.turn, "turn")
    if call.call_id is None:
        raise EffectLedgerValidationError(
            f"tool {call.tool!r} has scope='call', and this call has no call_id: pass the "
            "framework's tool-call id (tool.invoke(arguments, call_id=...), "
            "ledger.run(..., call_id=...) or ToolCall(call_id=...)). Nothing was stored.",
            field="call_id",
        )
    return b',["call",%s]' % _encode_text(call.call_id, "call_id")


def _encode_text(text: str, field: str) -> bytes:
    try:
        return orjson.dumps(text)
    except orjson.JSONEncodeError as exc:
        raise EffectLedgerValidationError(f"{field}: {exc}", field=field) from None


def idempotency_key(call: ToolCall) -> str:
    """The idempotency key of ``call`` (also ``EffectLedger.idem_key``)."""
    return canonicalize(call).idem_key


_ABSENT: Final = object()


def mismatched_args(
    stored_args: str, call_args: str, validate_keys: Sequence[str] | Literal["all"]
) -> tuple[str, ...]:
    """The validated args whose values differ between two canonical args texts.

    Values are compared as JSON, the way keys compare them (``1`` and ``1.0``
    differ, dict order does not matter); an arg present on one side only
    differs. ``"all"`` validates every arg. Sorted names; empty when they agree.
    """
    if stored_args == call_args:
        # Canonical texts: equal text, equal args (the common replay).
        return ()
    before: dict[str, object] = orjson.loads(stored_args)
    after: dict[str, object] = orjson.loads(call_args)
    names = sorted(before.keys() | after.keys()) if validate_keys == "all" else validate_keys
    return tuple(
        sorted(
            name
            for name in names
            if _as_json(before.get(name, _ABSENT)) != _as_json(after.get(name, _ABSENT))
        )
    )


def _as_json(value: object) -> bytes | None:
    return None if value is _ABSENT else orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
