"""Signatures a user can guess: ``tx``, ``hooks`` and decision fields are keyword-only.

A positional slip (``approve(key, "looks fine")`` recording the note as the
approver) must be a TypeError, not a wrong receipt.
"""

from __future__ import annotations

import inspect

import pytest

from agent_ledger import EffectLedger

KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY

EXPECTED = {
    "run": (["call", "handler", "run_options"], ["hooks", "tx", "scope", "call_id"]),
    "begin": (["call"], ["tx", "run_options", "hooks"]),
    "commit": (["effect_id", "outcome"], ["attempt", "tx"]),
    "approve": (["idem_key"], ["by", "note", "expected_attempt"]),
    # The reason by position, as 0.2.x's deny(idem_key, reason) took it (issue 26,
    # item 10): the one decision field with no other reading in that place.
    "deny": (["idem_key", "reason"], ["by", "expected_attempt"]),
    "request_approval": (["idem_key"], ["attempt"]),
    "resolve": (["idem_key"], ["result", "error", "by", "note", "expected_attempt"]),
    "cancel": (["idem_key"], ["reason", "by"]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_keyword_only_parameters(name: str) -> None:
    positional, keyword_only = EXPECTED[name]
    params = list(inspect.signature(getattr(EffectLedger, name)).parameters.values())[1:]
    assert [p.name for p in params if p.kind is not KEYWORD_ONLY] == positional
    assert [p.name for p in params if p.kind is KEYWORD_ONLY] == keyword_only


async def test_a_positional_decision_field_is_a_type_error() -> None:
    from agent_ledger import EffectLedgerOptions, MemoryStore

    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    with pytest.raises(TypeError):
        await ledger.approve("f" * 64, "alice")  # type: ignore[call-arg]
