"""ToolCall and ResourceDescriptor validation at construction."""

from __future__ import annotations

import dataclasses

import pytest

from agent_ledger import EffectLedgerValidationError, ToolCall
from agent_ledger.calls import ResourceDescriptor


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workflow_id": "", "tool": "t"}, "workflow_id"),
        ({"workflow_id": "   ", "tool": "t"}, "workflow_id"),
        ({"workflow_id": 5, "tool": "t"}, "workflow_id"),
        ({"workflow_id": "w", "tool": ""}, "tool"),
        ({"workflow_id": "w\x00", "tool": "t"}, "workflow_id"),
        ({"workflow_id": "w", "tool": None}, "tool"),
        ({"workflow_id": "w", "tool": "t", "args": [1, 2]}, "args"),
        ({"workflow_id": "w", "tool": "t", "call_id": ""}, "call_id"),
        ({"workflow_id": "w", "tool": "t", "resource": {"namespace": "n"}}, "resource"),
        (
            {"workflow_id": "w", "tool": "t", "args": {"a": 1}, "idempotency_keys": []},
            "idempotency_keys",
        ),
        (
            {"workflow_id": "w", "tool": "t", "args": {"a": 1}, "idempotency_keys": "a"},
            "idempotency_keys",
        ),
        (
            {"workflow_id": "w", "tool": "t", "args": {"a": 1}, "idempotency_keys": ["a", "a"]},
            "idempotency_keys",
        ),
        (
            {"workflow_id": "w", "tool": "t", "args": {"a": 1}, "idempotency_keys": ["b"]},
            "idempotency_keys",
        ),
        (
            {"workflow_id": "w", "tool": "t", "args": {"a": 1}, "idempotency_keys": [1]},
            "idempotency_keys",
        ),
    ],
)
def test_invalid_tool_calls_name_the_field(kwargs: dict[str, object], field: str) -> None:
    """Every malformed ToolCall raises at construction, naming the field."""
    with pytest.raises(EffectLedgerValidationError) as info:
        ToolCall(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"namespace": "", "type": "t", "id": {"k": 1}}, "resource.namespace"),
        ({"namespace": "n", "type": "", "id": {"k": 1}}, "resource.type"),
        ({"namespace": "n", "type": "t", "id": {}}, "resource.id"),
        ({"namespace": "n", "type": "t", "id": "abc"}, "resource.id"),
    ],
)
def test_invalid_resources_name_the_field(kwargs: dict[str, object], field: str) -> None:
    """A resource needs non-empty namespace and type and a non-empty id dict."""
    with pytest.raises(EffectLedgerValidationError) as info:
        ResourceDescriptor(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_tool_call_is_frozen_and_freezes_idempotency_keys() -> None:
    """Fields cannot be reassigned, and a list of key names becomes a tuple."""
    names = ["a"]
    call = ToolCall(workflow_id="w", tool="t", args={"a": 1}, idempotency_keys=names)
    names.append("b")
    assert call.idempotency_keys == ("a",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.tool = "other"  # type: ignore[misc]
