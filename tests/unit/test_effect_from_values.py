"""``effect_from_values`` and ``effect_from_fields`` build the same frozen ``Effect`` as its
constructor, only cheaper."""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from agent_ledger.effects import Effect, effect_from_fields, effect_from_values
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


def test_effect_from_fields_reads_each_field_by_its_name_and_takes_the_result_given() -> None:
    values = _distinct_values()
    row = SimpleNamespace(**dict(zip(EFFECT_FIELDS, values, strict=True)))
    row.result = "the stored text, not the decoded result"
    built = effect_from_fields(row, {"decoded": True})
    assert type(built) is Effect
    expected = dict(zip(EFFECT_FIELDS, values, strict=True)) | {"result": {"decoded": True}}
    assert {name: getattr(built, name) for name in EFFECT_FIELDS} == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.result = None  # type: ignore[misc]
