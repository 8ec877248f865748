"""The idempotency key and canonical JSON: what makes two calls the same."""

from __future__ import annotations

import hashlib
import json
import math
import random
import uuid
from collections.abc import Callable
from enum import Enum

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agent_ledger import EffectLedgerValidationError, JSONValue, ToolCall
from agent_ledger.calls import ResourceDescriptor
from agent_ledger.keys import MAX_DEPTH, canonical_json, canonicalize, idempotency_key
from tests.strategies import json_objects, json_values, texts


def _reference_key(workflow_id: str, tool: str, mode: str, identity: object) -> str:
    """The documented definition, computed with the standard library only."""
    material = json.dumps(
        ["agent-ledger/v1", workflow_id, tool, mode, identity],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def test_key_matches_the_documented_definition_for_args() -> None:
    """The key is SHA-256 of the canonical JSON array [version, workflow, tool, mode, identity]."""
    call = ToolCall(workflow_id="order-1", tool="stripe.charge", args={"b": 2, "a": "é"})
    assert idempotency_key(call) == _reference_key("order-1", "stripe.charge", "args", call.args)


def test_key_matches_the_documented_definition_for_a_resource() -> None:
    """With a resource descriptor, the descriptor replaces the args as identity."""
    resource = ResourceDescriptor(namespace="github", type="issue", id={"repo": "app"})
    call = ToolCall(workflow_id="w", tool="gh.create", args={"x": 1}, resource=resource)
    identity = {"namespace": "github", "type": "issue", "id": {"repo": "app"}}
    assert idempotency_key(call) == _reference_key("w", "gh.create", "resource", identity)


def test_key_matches_the_documented_definition_for_an_args_subset() -> None:
    """With idempotency_keys, only the named args are the identity."""
    call = ToolCall(
        workflow_id="w", tool="t", args={"to": "a@b.c", "sent_at": 1}, idempotency_keys=["to"]
    )
    assert idempotency_key(call) == _reference_key("w", "t", "args_subset", {"to": "a@b.c"})


def test_args_outside_the_subset_do_not_change_the_key() -> None:
    """Retries that differ only in unnamed args are the same effect."""
    first = ToolCall(workflow_id="w", tool="t", args={"to": "x", "ts": 1}, idempotency_keys=["to"])
    retry = ToolCall(workflow_id="w", tool="t", args={"to": "x", "ts": 2}, idempotency_keys=["to"])
    assert idempotency_key(first) == idempotency_key(retry)


def test_resource_calls_ignore_args() -> None:
    """Two calls on the same resource are one effect whatever their args."""
    resource = ResourceDescriptor(namespace="n", type="t", id={"k": 1})
    one = ToolCall(workflow_id="w", tool="t", args={"body": "v1"}, resource=resource)
    two = ToolCall(workflow_id="w", tool="t", args={"body": "v2"}, resource=resource)
    assert idempotency_key(one) == idempotency_key(two)


def test_call_id_is_not_part_of_the_key() -> None:
    """call_id labels an invocation; retries with new call ids are still one effect."""
    one = ToolCall(workflow_id="w", tool="t", args={}, call_id="call_1")
    two = ToolCall(workflow_id="w", tool="t", args={}, call_id="call_2")
    assert idempotency_key(one) == idempotency_key(two)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (("a|b", "c"), ("a", "b|c")),
        (('a","b', "c"), ("a", 'b","c')),
        (("a", "b,c"), ("a,b", "c")),
        (("a\x01", "b"), ("a", "\x01b")),
    ],
)
def test_separators_inside_parts_cannot_collide(
    left: tuple[str, str], right: tuple[str, str]
) -> None:
    """Characters that a naive join would use as separators stay inside their part."""
    one = ToolCall(workflow_id=left[0], tool=left[1])
    two = ToolCall(workflow_id=right[0], tool=right[1])
    assert idempotency_key(one) != idempotency_key(two)


def test_modes_never_collide_with_each_other() -> None:
    """Args that look like a resource descriptor do not share its key."""
    resource = ResourceDescriptor(namespace="n", type="t", id={"k": 1})
    as_resource = ToolCall(workflow_id="w", tool="x", resource=resource)
    as_args = ToolCall(
        workflow_id="w", tool="x", args={"namespace": "n", "type": "t", "id": {"k": 1}}
    )
    assert idempotency_key(as_resource) != idempotency_key(as_args)


def test_int_and_float_are_different_values() -> None:
    """1 and 1.0 are different JSON texts, so different calls."""
    one = ToolCall(workflow_id="w", tool="t", args={"n": 1})
    two = ToolCall(workflow_id="w", tool="t", args={"n": 1.0})
    assert idempotency_key(one) != idempotency_key(two)


@given(st.dictionaries(texts, json_values, max_size=8), st.randoms())
def test_key_is_invariant_under_dict_order(args: dict[str, JSONValue], rnd: random.Random) -> None:
    """Insertion order of args (at every level) never changes the key."""
    items = list(args.items())
    rnd.shuffle(items)
    shuffled = dict(items)
    one = ToolCall(workflow_id="w", tool="t", args=args)
    two = ToolCall(workflow_id="w", tool="t", args=shuffled)
    assert idempotency_key(one) == idempotency_key(two)


@given(texts, texts, json_objects, texts, texts, json_objects)
def test_distinct_calls_have_distinct_keys(
    w1: str, t1: str, a1: dict[str, JSONValue], w2: str, t2: str, a2: dict[str, JSONValue]
) -> None:
    """Calls that differ as JSON values get different keys."""
    same = (w1, t1, orjson.dumps(a1, option=orjson.OPT_SORT_KEYS)) == (
        w2,
        t2,
        orjson.dumps(a2, option=orjson.OPT_SORT_KEYS),
    )
    assume(not same)
    one = ToolCall(workflow_id=w1, tool=t1, args=a1)
    two = ToolCall(workflow_id=w2, tool=t2, args=a2)
    assert idempotency_key(one) != idempotency_key(two)


@given(json_values)
def test_canonical_json_round_trips(value: object) -> None:
    """Decoding canonical JSON gives back the value (tuples as lists)."""
    encoded = canonical_json(value, field="args")
    assert orjson.loads(encoded) == json.loads(json.dumps(value))
    # And it is canonical: encoding the decoded value gives the same bytes.
    assert canonical_json(orjson.loads(encoded), field="args") == encoded


def test_canonical_json_sorts_keys_and_drops_whitespace() -> None:
    """Sorted keys, compact separators, UTF-8 (not \\u escapes)."""
    assert canonical_json({"b": [1, 2], "a": {"y": "é", "x": None}}, field="f") == (
        '{"a":{"x":null,"y":"é"},"b":[1,2]}'.encode()
    )


class Color(Enum):
    RED = "red"


class MyStr(str):
    pass


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"x": math.nan}, "args['x']: nan is not allowed"),
        ({"x": [1, math.inf]}, "args['x'][1]: inf is not allowed"),
        ({"x": -math.inf}, "-inf is not allowed"),
        ({"x": {1, 2}}, "set is not a JSON value"),
        ({"x": b"raw"}, "bytes is not a JSON value"),
        ({"x": object()}, "object is not a JSON value"),
        ({"x": {1: "a"}}, "object key 1 is a int"),
        ({"x": Color.RED}, "Color is not a JSON value"),
        ({"x": MyStr("s")}, "MyStr is not a JSON value"),
        ({"x": uuid.UUID(int=1)}, "UUID is not a JSON value"),
        ({"x": 2**64}, "does not fit in 64 bits"),
        ({"x": "\ud800"}, "surrogates not allowed"),
    ],
)
def test_non_json_args_are_rejected_with_their_location(
    value: dict[str, object], fragment: str
) -> None:
    """Each non-JSON value gets an error naming the field, the path and the problem."""
    call = ToolCall(workflow_id="w", tool="t", args=value)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="args") as info:
        canonicalize(call)
    assert fragment in str(info.value)
    assert info.value.field == "args"


def test_too_deep_nesting_is_rejected_clearly() -> None:
    """A structure deeper than MAX_DEPTH gets a validation error, not a RecursionError."""
    deep: object = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(EffectLedgerValidationError, match="nested deeper"):
        canonical_json(deep, field="args")


def test_args_over_the_size_limit_are_rejected() -> None:
    """max_args_size_bytes bounds the canonical JSON size and the error says both sizes."""
    call = ToolCall(workflow_id="w", tool="t", args={"blob": "x" * 100})
    with pytest.raises(EffectLedgerValidationError, match=r"over max_args_size_bytes=50"):
        canonicalize(call, max_args_size_bytes=50)
    assert canonicalize(call, max_args_size_bytes=200).idem_key


def test_64_bit_boundaries_are_accepted() -> None:
    """Both ends of the signed and unsigned 64-bit ranges are valid integers."""
    for n in (-(2**63), 2**63 - 1, 2**64 - 1):
        assert orjson.loads(canonical_json({"n": n}, field="args")) == {"n": n}


def test_nul_is_escaped_like_any_control_character() -> None:
    """U+0000 in a key or a value is valid JSON, written as the escape \\u0000 (issue 10,
    item 11): the canonical text has no NUL byte, so every store can keep it."""
    value = {"k\x00": ["a\x00b", "\x00"]}
    encoded = canonical_json(value, field="args")
    assert encoded == b'{"k\\u0000":["a\\u0000b","\\u0000"]}'
    assert b"\x00" not in encoded
    assert orjson.loads(encoded) == value


@pytest.mark.parametrize(
    "make",
    [
        lambda text: ToolCall(workflow_id="w", tool="t", args={"to": text}),
        lambda text: ToolCall(workflow_id="w", tool="t", args={text: 1}),
        lambda text: ToolCall(
            workflow_id="w", tool="t", args={"to": text, "n": 1}, idempotency_keys=["to"]
        ),
        lambda text: ToolCall(
            workflow_id="w", tool="t", resource=ResourceDescriptor("gh", "issue", {"id": text})
        ),
    ],
    ids=["arg-value", "arg-name", "args-subset", "resource-id"],
)
def test_nul_is_part_of_the_key(make: Callable[[str], ToolCall]) -> None:
    """Calls that differ only by U+0000 against another character, or its absence, are
    different effects."""
    keys = {idempotency_key(make(text)) for text in ("ada\x00", "ada\x01", "ada ", "ada")}
    assert len(keys) == 4


def test_lone_surrogate_in_workflow_id_is_rejected() -> None:
    """Text that cannot be UTF-8 encoded is named in the error."""
    call = ToolCall(workflow_id="w\udc00", tool="t")
    with pytest.raises(EffectLedgerValidationError, match="workflow_id"):
        canonicalize(call)
