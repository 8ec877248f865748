"""The migration guide says which 0.2.x top-level names import quietly and which
are deprecated aliases, and where the latter live now; the warnings say the
same (issue 26 follow-up, finding 5: the guide listed eight deprecated aliases
as plainly importable). Also: a 0.2.x module's warning never points at a
top-level name that warns in turn, and ``store.size`` on a store that is not a
``MemoryStore`` says what to use instead."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import agent_ledger
from agent_ledger import SqliteStore
from agent_ledger.legacy.names import MODULE_NAMES

GUIDE = Path(__file__).parents[2] / "docs" / "migrating-from-0.2.md"


def _rows() -> tuple[dict[str, None], dict[str, str]]:
    """(names the guide calls importable, {deprecated alias: the module it names})."""
    quiet: dict[str, None] = {}
    aliases: dict[str, str] = {}
    for line in GUIDE.read_text().splitlines():
        if not line.startswith("| `from agent_ledger import`"):
            continue
        names_cell, says = line.split(" | ")[0], line.split(" | ")[1]
        if "deprecated top-level aliases" in says:
            # `A`, `B` (`module`), `C` (`module2`): each name, then its module.
            pending: list[str] = []
            for token in re.findall(
                r"`([^`]+)`(?: \(now in `([^`]+)`\)| \(`([^`]+)`\))?", names_cell
            ):
                name, home = token[0], token[1] or token[2]
                if name == "from agent_ledger import":
                    continue
                pending.append(name)
                if home:
                    aliases.update(dict.fromkeys(pending, home))
                    pending = []
            assert not pending, f"names without a module in the guide: {pending}"
        else:
            for name in re.findall(r"`([^`]+)`", names_cell):
                if name != "from agent_ledger import":
                    quiet[name] = None
    return quiet, aliases


QUIET, ALIASES = _rows()


def test_the_guide_has_both_rows() -> None:
    assert len(ALIASES) == 8, ALIASES
    assert "EffectLedger" in QUIET and not set(QUIET) & set(ALIASES)


@pytest.mark.parametrize("name", sorted(QUIET))
def test_a_name_the_guide_calls_importable_imports_without_a_warning(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(agent_ledger, name) is not None


@pytest.mark.parametrize(("name", "home"), sorted(ALIASES.items()))
def test_a_deprecated_alias_warns_naming_the_module_the_guide_names(name: str, home: str) -> None:
    with pytest.warns(DeprecationWarning, match=re.escape(f"from {home} import {name}")):
        value = getattr(agent_ledger, name)
    assert value is getattr(importlib.import_module(home), name)


@pytest.mark.parametrize("name", sorted(set(ALIASES) & set(MODULE_NAMES["agent_ledger.types"])))
def test_a_0_2_module_points_at_an_import_that_does_not_warn_again(name: str) -> None:
    types = importlib.import_module("agent_ledger.types")
    with pytest.warns(DeprecationWarning, match="0.2.x.s module") as caught:
        getattr(types, name)
    spelling = re.search(r"import \w+ as ([\w.]+)", str(caught[0].message))
    assert spelling is not None, str(caught[0].message)
    module, _, attribute = spelling.group(1).rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(importlib.import_module(module), attribute) is not None


def test_size_on_a_store_other_than_memory_says_what_to_use(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "ledger.db")
    with pytest.raises(AttributeError, match=r"SqliteStore\.size: .*store\.stats\(\)\)\.total"):
        _ = store.size
    assert not hasattr(store, "size")
