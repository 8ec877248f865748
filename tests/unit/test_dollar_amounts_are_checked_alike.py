"""A cost a ``Usage`` carries and a cost a pricing callback returns pass the same
check (``agent_ledger.effects.is_usd_amount``): a finite int or float from 0 to
``MAX_USAGE_COST_USD``, never a bool, a string or NaN."""

from __future__ import annotations

import math

import pytest

from agent_ledger.effects import MAX_USAGE_COST_USD, Usage, is_usd_amount
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.tools._llm import _price

GOOD: list[object] = [0, 0.0, 1, 0.0031, MAX_USAGE_COST_USD, int(MAX_USAGE_COST_USD)]
BAD: list[object] = [
    -0.01,
    -1,
    math.nan,
    math.inf,
    MAX_USAGE_COST_USD * 1.000001,
    True,
    False,
    "1",
    None,
    [1.0],
]


@pytest.mark.parametrize("amount", GOOD, ids=repr)
def test_a_dollar_amount_is_accepted_by_usage_and_by_pricing(amount: object) -> None:
    assert is_usd_amount(amount)
    usage = Usage(1, 2, amount)
    assert usage.cost_usd == float(amount)
    assert type(usage.cost_usd) is float
    priced = _price(lambda p, m, u: amount, "fake", "m1", Usage(1, 2))
    assert priced == float(amount) and type(priced) is float


@pytest.mark.parametrize("amount", BAD, ids=repr)
def test_anything_else_is_refused_by_both(amount: object) -> None:
    assert not is_usd_amount(amount)
    if amount is not None:  # None is Usage's "cost unknown"
        with pytest.raises(EffectLedgerValidationError) as usage_error:
            Usage(1, 2, amount)  # type: ignore[arg-type]
        assert usage_error.value.field == "cost_usd"
    with pytest.raises(EffectLedgerValidationError) as pricing_error:
        _price(lambda p, m, u: amount, "fake", "m1", Usage(1, 2))  # type: ignore[arg-type,return-value]
    assert pricing_error.value.field == "pricing"
