"""A compensation runs by the path any call of its tool takes: the engine's handler
threads for a plain function, the tool's own options, the forward effect on every
attempt, and only the saga layer checks a tool's saga settings."""

from __future__ import annotations

import threading

import pytest

from agent_ledger import Effect, EffectLedgerValidationError, EffectStatus, RetryPolicy
from agent_ledger.sagas import SagaFailed, check_step_settings
from tests.harness import StoreHarness


class Declined(Exception):
    pass


async def test_a_plain_compensation_runs_in_the_engines_handler_threads(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    ran_in: list[str] = []

    @ledger.tool("refund")
    def refund(forward: Effect, /) -> str:  # plain and positional-only, as a tool may be
        ran_in.append(threading.current_thread().name)
        return f"refunded {forward.result}"

    @ledger.tool("charge", compensate="refund")
    async def charge(amount: int) -> str:
        return f"ch_{amount}"

    @ledger.tool("ship")
    async def ship() -> None:
        raise Declined("no stock")

    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("order-1"):
            await charge(5)
            await ship()
    assert failed.value.outcome.status.value == "compensated"
    # The engine's pool (sync_handlers="thread"), as for any plain tool; not
    # a thread the saga layer started on its own.
    assert len(ran_in) == 1 and ran_in[0].startswith("agent-ledger-handler")
    undo = failed.value.outcome.steps[0].compensation
    assert undo is not None and undo.status is EffectStatus.SUCCEEDED
    assert undo.result == "refunded ch_5"


async def test_every_try_of_a_compensation_gets_the_forward_effect(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    seen: list[object] = []

    @ledger.tool("release", retry=RetryPolicy(on=ConnectionError, attempts=3, initial_ms=1))
    async def release(forward: Effect) -> str:
        seen.append(forward)
        if len(seen) < 3:
            raise ConnectionError("try again")
        return "released"

    @ledger.tool("hold", compensate="release")
    async def hold(seat: str) -> str:
        return seat

    with pytest.raises(SagaFailed):
        async with ledger.saga("trip-1"):
            await hold("12A")
            raise Declined("the trip was called off")
    # The tries after the first ran on the forward effect too, never on the
    # undo's recorded args (its key: the forward key).
    assert len(seen) == 3
    assert all(isinstance(f, Effect) and f.result == "12A" for f in seen)


def test_saga_settings_are_checked_by_the_saga_layer_at_registration(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError) as bad:
        ledger.tool("pay", failure_scope="everything")  # type: ignore[arg-type]
    assert bad.value.field == "failure_scope"
    assert "pay" not in ledger.tools
    with pytest.raises(EffectLedgerValidationError) as same:
        check_step_settings("pay", "pay", "succeeded", "saga")
    assert same.value.field == "compensate"
    check_step_settings("pay", "refund", "attempted", "step")  # valid: returns
