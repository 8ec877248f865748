"""0.2.x's public names: same meaning -> deprecated alias; none -> a clear error."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest

import agent_ledger
from agent_ledger import EffectStatus, ToolCall
from agent_ledger.effects import CommitFailed, CommitSucceeded, JSONValue
from agent_ledger.keys import idempotency_key
from agent_ledger.legacy.names import GONE, RemovedNameError
from agent_ledger.status import TERMINAL
from agent_ledger.stores.base import Store


def test_renamed_names_warn_with_the_new_spelling() -> None:
    expected = {
        "compute_idem_key": (idempotency_key, "agent_ledger.keys.idempotency_key"),
        "EffectStore": (Store, "agent_ledger.Store"),
        "JsonValue": (JSONValue, "agent_ledger.JSONValue"),
        "TERMINAL_STATUSES": (TERMINAL, "agent_ledger.status.TERMINAL"),
    }
    for name, (value, spelling) in expected.items():
        with pytest.warns(DeprecationWarning, match=spelling.replace(".", r"\.")):
            assert getattr(agent_ledger, name) is value
    # 0.2.x's terminal set: the same four statuses.
    assert {s.value for s in TERMINAL} == {"succeeded", "failed", "canceled", "denied"}


def test_is_terminal_status_and_commit_outcome_keep_their_meaning() -> None:
    with pytest.warns(DeprecationWarning, match="agent_ledger.status.TERMINAL"):
        is_terminal = agent_ledger.is_terminal_status
    assert callable(is_terminal)
    assert [s.value for s in EffectStatus if is_terminal(s)] == [
        s.value for s in EffectStatus if s in TERMINAL
    ]
    assert is_terminal("denied") and not is_terminal("requires_approval")
    with pytest.warns(DeprecationWarning, match="CommitSucceeded"):
        outcome = agent_ledger.CommitOutcome
    assert set(getattr(outcome, "__args__", ())) == {CommitSucceeded, CommitFailed}


def test_compute_idem_key_gives_this_versions_key() -> None:
    call = ToolCall("wf", "tool", {"a": 1})
    with pytest.warns(DeprecationWarning, match="legacy_key_of"):
        compute = agent_ledger.compute_idem_key
    assert callable(compute)
    assert compute(call) == idempotency_key(call)


@pytest.mark.parametrize("name", sorted(GONE))
def test_names_without_an_equivalent_say_what_to_use(name: str) -> None:
    expected = f"agent_ledger.{name} (agent-ledger 0.2.x) has no equivalent here: {GONE[name]}"
    # Attribute access and `from ... import` (CPython would replace an
    # AttributeError from __getattr__ with its generic "cannot import name").
    with pytest.raises(RemovedNameError) as attribute:
        getattr(agent_ledger, name)
    with pytest.raises(RemovedNameError) as imported:
        exec(f"from agent_ledger import {name}", {})
    for caught in (attribute, imported):
        message = str(caught.value)
        assert message.startswith(expected)
        assert message.endswith("see docs/migrating-from-0.2.md")
        assert "cannot import name" not in message
        assert isinstance(caught.value, ImportError)
        assert not isinstance(caught.value, AttributeError)
    # The documented price: probing for a removed name raises too.
    with pytest.raises(RemovedNameError):
        hasattr(agent_ledger, name)


def test_thirteen_names_are_gone() -> None:
    assert len(GONE) == 13
    assert "canonicalize" in GONE


def test_unknown_names_are_still_plain_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        agent_ledger.nonsense  # noqa: B018
    assert importlib.import_module("agent_ledger") is agent_ledger


@pytest.mark.parametrize(
    ("name", "spelling"),
    [
        ("effect_timeout_s", "wait_timeout_ms"),
        ("approval_timeout_s", "approval_timeout_ms"),
        ("initial_interval_s", "initial_interval_ms"),
        ("max_interval_s", "max_interval_ms"),
    ],
)
def test_0_2_options_in_seconds_name_the_millisecond_option(name: str, spelling: str) -> None:
    """Wherever a 0.2.x user writes one (its place was ConcurrencyOptions)."""
    from agent_ledger import MemoryStore
    from agent_ledger.errors import EffectLedgerValidationError
    from agent_ledger.options import (
        ConcurrencyOptions,
        EffectLedgerOptions,
        LedgerDefaults,
        RunOptions,
        StaleOptions,
    )

    old: dict[str, Any] = {name: 30.0}
    builders: list[Callable[[], object]] = [
        lambda: ConcurrencyOptions(**old),
        lambda: EffectLedgerOptions(store=MemoryStore(), **old),
        lambda: RunOptions(**old),
        lambda: StaleOptions(**old),
        lambda: LedgerDefaults(**old),
    ]
    for build in builders:
        with pytest.raises(EffectLedgerValidationError) as info:
            build()
        message = str(info.value)
        assert f"{name} is agent-ledger 0.2.x's option in seconds" in message
        assert f"ConcurrencyOptions({spelling}=...) (milliseconds)" in message
        assert info.value.field == name
    # Any other unknown name is still Python's own TypeError.
    with pytest.raises(TypeError, match="unexpected keyword argument 'timeout_s'"):
        other: dict[str, Any] = {"timeout_s": 1.0}
        ConcurrencyOptions(**other)
    assert ConcurrencyOptions(wait_timeout_ms=30_000).wait_timeout_ms == 30_000
