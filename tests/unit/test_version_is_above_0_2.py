"""This release is numbered above the agent-ledger 0.2.x on the package index, and
the README says which version it is (issue 30)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from agent_ledger._version import __version__
from agent_ledger.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_above_every_0_2_release() -> None:
    parts = tuple(int(p) for p in __version__.split("."))
    assert len(parts) == 3 and parts > (0, 2, 999), __version__


def test_the_cli_and_the_readme_give_that_version() -> None:
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert out.getvalue() == f"agent-ledger {__version__}\n"
    readme = (ROOT / "README.md").read_text()
    assert f"This is agent-ledger {__version__}." in readme
    assert "agent-ledger 0.2.x on\nthe package index" in readme
