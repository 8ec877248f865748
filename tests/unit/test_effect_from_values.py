"""``effect_from_values`` builds the same frozen ``Effect`` as its constructor, only cheaper."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from agent_ledger.effects import Effect, effect_from_values
from agent_ledger.fields import EFFECT_FIELDS


def _distinct_values() -> tuple[Any, ...]:
    # A different value per field: a slot filled from the wrong position shows.
    return tuple(f"value of {name}" for name in EFFECT_FIELDS)


def test_every_field_lands_in_its_own_slot() -> None:
    values = _distinct_values()
    built = effect_from_values(values)
    assert type(built) is Effect
    assert {f.name: getattr(built, f.name) for f in dataclasses.fields(Effect)} == dict(
        zip(EFFECT_FIELDS, values, strict=True)
    )
    assert built == Effect(*values)
    assert hash(built) == hash(Effect(*values))


def test_the_effect_it_builds_stays_frozen() -> None:
    built = effect_from_values(_distinct_values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.tool = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del built.tool


def test_the_effect_it_builds_copies_replaces_and_pickles_like_any_other() -> None:
    values = _distinct_values()
    built = effect_from_values(values)
    assert dataclasses.replace(built, tool="x") == dataclasses.replace(Effect(*values), tool="x")
    assert pickle.loads(pickle.dumps(built)) == built


def test_a_wrong_number_of_values_is_refused() -> None:
    with pytest.raises(ValueError, match="not enough values to unpack"):
        effect_from_values(_distinct_values()[:-1])
