"""The model-based test of the contract suite, run longer: more and deeper sequences."""

from __future__ import annotations

import pytest

from tests.contract.test_state_machine import run_model
from tests.harness import STORE_KINDS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_store_follows_the_model_for_long_sequences(kind: str) -> None:
    """400 sequences of up to 40 steps: begin, replay, claim/takeover, commit (fenced),
    heartbeat, request/approve/deny/cancel and clock advances, checked after every step."""
    run_model(kind, max_examples=400, steps=40)
