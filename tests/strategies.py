"""Hypothesis strategies shared by the test suite."""

from __future__ import annotations

from hypothesis import strategies as st

#: Names (workflow ids, tools): valid UTF-8 (no lone surrogates), no U+0000, non-blank.
texts = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=12
).filter(lambda s: s.strip() != "")

#: Any character JSON text can hold: all but lone surrogates (U+0000 included).
_json_characters = st.characters(exclude_categories=["Cs"])

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(_json_characters, max_size=12)
)

#: Any JSON value: what args and results may be.
json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(_json_characters, max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

#: JSON objects: what args may be.
json_objects = st.dictionaries(st.text(_json_characters, max_size=8), json_values, max_size=5)
