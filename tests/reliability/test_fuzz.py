"""Fuzz: arbitrary JSON-ish values through run() on every store.

Valid JSON must round-trip exactly (as JSON: tuples come back as lists);
anything else must raise EffectLedgerValidationError. Bad args store
nothing; a bad result is recorded as a result_not_serializable failure.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_ledger import EffectLedgerValidationError, EffectStatus, ToolCall
from tests.harness import StoreHarness
from tests.strategies import json_values

pytestmark = pytest.mark.slow

_bad_scalars = st.sampled_from(
    [math.nan, math.inf, -math.inf, b"raw", {1, 2}, object(), "\ud800", 2**70]
)
json_ish = st.recursive(
    json_values | _bad_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=5) | st.integers(0, 3), inner, max_size=3)
    ),
    max_leaves=8,
)


def is_json(value: Any) -> bool:
    try:
        # ensure_ascii=False: with escapes, a lone surrogate would pass as "\udXXX".
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False

    def ints_fit(v: Any) -> bool:
        if type(v) is int:
            return -(2**63) <= v <= 2**64 - 1
        if isinstance(v, dict):
            return all(type(k) is str for k in v) and all(ints_fit(x) for x in v.values())
        if isinstance(v, list | tuple):
            return all(ints_fit(x) for x in v)
        return type(v) in (str, float, bool) or v is None

    return ints_fit(value)


@settings(max_examples=60, deadline=None)
@given(args=json_ish, result=json_ish)
async def test_run_round_trips_json_and_rejects_the_rest(
    harness: StoreHarness, args: Any, result: Any
) -> None:
    """Either the exact JSON comes back on replay, or a validation error and a clean store."""
    ledger = harness.ledger()
    call = ToolCall(workflow_id=f"fuzz-{uuid.uuid4().hex}", tool="t", args={"value": args})
    before = await harness.raw_count()
    if not is_json(args):
        with pytest.raises(EffectLedgerValidationError):
            await ledger.run(call, lambda e: result)
        assert await harness.raw_count() == before
        return
    if not is_json(result):
        with pytest.raises(EffectLedgerValidationError):
            await ledger.run(call, lambda e: result)
        effect = await ledger.find_by_idem_key(ledger.idem_key(call))
        assert effect is not None and effect.status is EffectStatus.FAILED
        assert effect.error is not None and effect.error.code == "result_not_serializable"
        return
    assert await ledger.run(call, lambda e: result) == result
    replayed = await ledger.run(call, lambda e: "not called")
    assert replayed == json.loads(json.dumps(result))
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None and json.loads(effect.args_canonical) == {
        "value": json.loads(json.dumps(args))
    }
