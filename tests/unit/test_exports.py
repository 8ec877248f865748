"""The public surface: what ``import agent_ledger`` offers."""

from __future__ import annotations

import agent_ledger


def test_all_is_sorted_and_importable() -> None:
    """__all__ lists real names, in sorted order."""
    names = [n for n in agent_ledger.__all__ if not n.startswith("__")]
    assert names == sorted(names, key=lambda n: (not n.isupper(), n.islower(), n))
    for name in agent_ledger.__all__:
        assert hasattr(agent_ledger, name), name


def test_errors_report_the_public_module() -> None:
    """Tracebacks show agent_ledger.X, not the private module path."""
    assert agent_ledger.EffectStoreError.__module__ == "agent_ledger"
    assert issubclass(agent_ledger.EffectLedgerValidationError, agent_ledger.EffectLedgerError)


def test_version_lives_in_one_place() -> None:
    """The package version comes from agent_ledger._version."""
    from importlib.metadata import version

    assert agent_ledger.__version__ == version("agent-ledger")
