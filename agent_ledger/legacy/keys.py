"""The idempotency key agent-ledger 0.2.x computed, so a switch can find old receipts.

0.2.x keyed a call as the SHA-256 hex digest of three texts joined with
``"|"``: the workflow id, the tool, and one *identity* text, by precedence

* ``NAMESPACE/TYPE/ID`` when the call had a resource (``ID`` the canonical
  JSON of the resource's id object);
* the canonical JSON of just the args named in ``idempotency_keys``;
* the canonical JSON of all the args.

Its canonical JSON was RFC 8785 (JCS): keys sorted by UTF-16 code unit,
numbers written the way JavaScript prints them (so ``1.0`` is ``1``: 0.2.x
could not tell them apart), integers only within +-(2**53 - 1). The ``"|"``
join is ambiguous (workflow ``"a|b"`` with tool ``"c"`` keys like workflow
``"a"`` with tool ``"b|c"``), which is why this version uses another
encoding (``agent_ledger.keys``). This module is a fact-level
reimplementation, checked against the real 0.2.1 package in tests/legacy/.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Final, Literal

from agent_ledger.calls import ResourceDescriptor, ToolCall
from agent_ledger.errors import EffectLedgerValidationError

#: The largest integer JCS accepts (JavaScript's Number.MAX_SAFE_INTEGER).
MAX_SAFE_INTEGER: Final = 2**53 - 1

_SHORT_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _string(text: str) -> str:
    out = ['"']
    for char in text:
        escaped = _SHORT_ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _number(value: float) -> str:
    """``value`` as JavaScript's Number.prototype.toString writes it."""
    if not math.isfinite(value):
        raise EffectLedgerValidationError(f"{value} is not allowed in JSON", field="args")
    if value == 0:
        return "0"
    if value < 0:
        return "-" + _number(-value)
    # repr gives the shortest digits that round-trip, as JavaScript does.
    mantissa, _, exp_text = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    digits = all_digits.lstrip("0")
    # point: where the decimal point sits, counted from the first digit.
    point = len(whole) + int(exp_text or 0) - (len(all_digits) - len(digits))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        return digits + "0" * (point - k)
    if 0 < point <= 21:
        return digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return "0." + "0" * (-point) + digits
    exponent = point - 1
    sign = "+" if exponent >= 0 else "-"
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(exponent)}"


def jcs(value: object) -> str:
    """``value`` as RFC 8785 canonical JSON text, the way 0.2.x encoded args."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        if abs(value) > MAX_SAFE_INTEGER:
            raise EffectLedgerValidationError(
                f"integer {value} is beyond what 0.2.x could key (+-2**53 - 1)", field="args"
            )
        return str(value)
    if type(value) is float:
        return _number(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(jcs(item) for item in value) + "]"
    if isinstance(value, dict):
        names = sorted(value, key=lambda name: str(name).encode("utf-16-be"))
        return "{" + ",".join(_string(str(n)) + ":" + jcs(value[n]) for n in names) + "}"
    raise EffectLedgerValidationError(f"{type(value).__name__} is not a JSON value", field="args")


def resource_text(resource: ResourceDescriptor) -> str:
    """0.2.x's identity text for a resource: ``NAMESPACE/TYPE/{canonical id}``."""
    return f"{resource.namespace}/{resource.type}/{jcs(dict(resource.id))}"


def legacy_key(workflow_id: str, tool: str, identity: str) -> str:
    """0.2.x's key from its three texts: SHA-256 hex of them joined with ``"|"``."""
    return hashlib.sha256(f"{workflow_id}|{tool}|{identity}".encode()).hexdigest()


def identity_text(call: ToolCall) -> str:
    """The third text 0.2.x hashed for ``call`` (see the module doc)."""
    if call.resource is not None:
        return resource_text(call.resource)
    if call.idempotency_keys is not None:
        return jcs({name: call.args[name] for name in call.idempotency_keys})
    return jcs(dict(call.args))


def legacy_key_of(call: ToolCall) -> str:
    """The key agent-ledger 0.2.x gave ``call``."""
    return legacy_key(call.workflow_id, call.tool, identity_text(call))


def legacy_key_or_none(call: ToolCall) -> str | None:
    """0.2.x's key for ``call``, or None when 0.2.x could not have made the call
    (an integer beyond +-(2**53 - 1), or a value its JSON did not know)."""
    try:
        return legacy_key_of(call)
    except EffectLedgerValidationError:
        return None


def legacy_mismatched_args(
    stored_args: str, call_args: str, validate_keys: Sequence[str] | Literal["all"]
) -> tuple[str, ...]:
    """``agent_ledger.keys.mismatched_args`` as 0.2.x compared values: ``1`` and
    ``1.0`` agree (its canonical JSON wrote both as ``1``).

    For a call answered by an imported effect, whose stored args are what
    0.2.x kept: a value 0.2.x could not tell from the stored one is the same
    request, any other differs.
    """
    before: dict[str, object] = json.loads(stored_args)
    after: dict[str, object] = json.loads(call_args)
    names = sorted(before.keys() | after.keys()) if validate_keys == "all" else validate_keys
    return tuple(sorted(name for name in names if _as_0_2(before, name) != _as_0_2(after, name)))


def _as_0_2(args: dict[str, object], name: str) -> str | None:
    if name not in args:
        return None
    try:
        return jcs(args[name])
    except EffectLedgerValidationError:
        # Beyond what 0.2.x could key: compared exactly.
        return "exact:" + json.dumps(args[name], sort_keys=True)
