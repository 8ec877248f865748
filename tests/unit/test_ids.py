"""Effect ids: canonical UUID strings, the same test on every store."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_ledger.ids import is_effect_id, new_effect_id


def test_new_ids_are_canonical_version_4_uuids() -> None:
    ids = {new_effect_id() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        parsed = uuid.UUID(text)
        assert is_effect_id(text) and parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
    # The variant digit takes each of its four values (uniform in 16 random digits).
    assert {text[19] for text in ids} == set("89ab")


def test_ids_stay_unique_when_the_application_seeds_random() -> None:
    """Seeding the random module (as ML code and test frameworks do) must not repeat ids.

    Two processes seeded alike would otherwise insert the same id; the fuzz
    test hit it as a UNIQUE violation on SQLite under hypothesis' seeding.
    """
    import random

    random.seed(42)
    first = new_effect_id()
    random.seed(42)
    assert new_effect_id() != first


@pytest.mark.parametrize(
    "text",
    [
        "0B0E4F5E-1111-4222-8333-444455556666",  # uppercase
        "0b0e4f5e111142228333444455556666",  # no hyphens
        "{0b0e4f5e-1111-4222-8333-444455556666}",
        "urn:uuid:0b0e4f5e-1111-4222-8333-444455556666",
        " 0b0e4f5e-1111-4222-8333-444455556666",
        "",
        "not-a-uuid",
        None,
        42,
        b"0b0e4f5e-1111-4222-8333-444455556666",
    ],
)
def test_only_the_canonical_form_is_an_effect_id(text: object) -> None:
    assert not is_effect_id(text)


def test_the_canonical_form_is_an_effect_id() -> None:
    assert is_effect_id("0b0e4f5e-1111-4222-8333-444455556666")
    assert is_effect_id(str(uuid.uuid4()))


def _canonical_by_uuid(text: object) -> bool:
    """The definition: what ``uuid`` itself writes back unchanged."""
    if not isinstance(text, str):
        return False
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


_NEAR_MISSES = st.sampled_from("0123456789abcdefABCDEF-_{} :٣\n")


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.uuids().map(str),
        st.uuids().map(lambda u: str(u).upper()),
        st.uuids().map(lambda u: u.hex),
        # A canonical id with one character replaced or inserted.
        st.tuples(st.uuids().map(str), st.integers(0, 36), _NEAR_MISSES, st.booleans()).map(
            lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + (0 if t[3] else 1) :]
        ),
        st.text(_NEAR_MISSES, min_size=30, max_size=40),
        st.text(max_size=40),
    )
)
def test_the_effect_id_check_is_uuids_own_canonical_form(text: str) -> None:
    """is_effect_id (a pattern, for speed) answers what uuid.UUID's round trip answers."""
    assert is_effect_id(text) == _canonical_by_uuid(text)
