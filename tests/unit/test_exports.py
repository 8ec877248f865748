"""The public surface: what ``import agent_ledger`` offers, and where moved names went."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import agent_ledger
from agent_ledger import MOVED


def test_all_is_sorted_and_importable() -> None:
    """__all__ lists real names, in sorted order."""
    names = [n for n in agent_ledger.__all__ if not n.startswith("__")]
    assert names == sorted(names, key=lambda n: (not n.isupper(), n.islower(), n))
    for name in agent_ledger.__all__:
        assert hasattr(agent_ledger, name), name


def test_all_is_complete_and_short() -> None:
    """Every public name the package module binds is in __all__ (nothing public
    is exported by accident), and the surface stays about 25 names."""
    tree = ast.parse(Path(inspect.getfile(agent_ledger)).read_text())
    bound = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent_ledger")
        for alias in node.names
    }
    assert bound == set(agent_ledger.__all__)
    assert len(agent_ledger.__all__) <= 30


@pytest.mark.parametrize("name", sorted(MOVED))
def test_every_moved_name_still_resolves_with_a_warning_naming_its_home(name: str) -> None:
    home = MOVED[name]
    expected = getattr(importlib.import_module(home), name)
    with pytest.warns(DeprecationWarning, match=rf"agent_ledger\.{name} moved: .*from {home}"):
        found = getattr(agent_ledger, name)
    assert found is expected
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=home):
        exec(f"from agent_ledger import {name}", namespace)
    assert namespace[name] is expected
    assert name not in agent_ledger.__all__


def test_errors_report_the_public_module() -> None:
    """Tracebacks show agent_ledger.X for the errors exported there, and the
    errors module for the others (where they are imported from)."""
    assert agent_ledger.EffectStoreError.__module__ == "agent_ledger"
    assert issubclass(agent_ledger.EffectLedgerValidationError, agent_ledger.EffectLedgerError)
    from agent_ledger.errors import HandlerTimeoutError

    assert HandlerTimeoutError.__module__ == "agent_ledger.errors"


def test_version_lives_in_one_place() -> None:
    """The package version comes from agent_ledger._version."""
    from importlib.metadata import version

    assert agent_ledger.__version__ == version("agent-ledger")
