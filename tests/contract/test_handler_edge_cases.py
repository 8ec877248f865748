"""Handlers that misbehave in unusual ways still leave exactly one honest receipt."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import (
    Effect,
    EffectFailedError,
    EffectLedgerValidationError,
    EffectStatus,
    RunOptions,
    ToolCall,
)
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="payments.charge", args={"cents": 100})


@pytest.mark.parametrize("mode", ["thread", "loop"])
async def test_a_plain_handler_raising_stopiteration_is_recorded_not_hung(
    harness: StoreHarness, mode: str
) -> None:
    """`next(x for x in [])` in a plain handler: a failure, in either mode, never a hang."""
    ledger = harness.ledger(RunOptions(sync_handlers=mode))  # type: ignore[arg-type]

    empty: list[int] = []

    def pick(effect: Effect) -> int:
        return next(x for x in empty if x)

    async with asyncio.timeout(10):
        with pytest.raises((RuntimeError, StopIteration)):
            await ledger.run(CALL, pick)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.FAILED


class Unprintable(Exception):
    def __str__(self) -> str:
        raise KeyError("no message for you")


class BadCode(Exception):
    @property
    def code(self) -> str:
        raise IndexError("no code either")


@pytest.mark.parametrize("exc_type", [Unprintable, BadCode])
async def test_an_exception_that_cannot_describe_itself_is_still_recorded(
    harness: StoreHarness, exc_type: type[Exception]
) -> None:
    ledger = harness.ledger()
    runs = 0

    async def charge(effect: Effect) -> None:
        nonlocal runs
        runs += 1
        raise exc_type()

    with pytest.raises(exc_type):
        await ledger.run(CALL, charge)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert effect.error is not None and exc_type.__name__ in str(effect.error)
    with pytest.raises(EffectFailedError):
        await ledger.run(CALL, charge)  # the retry replays the failure
    assert runs == 1


@pytest.mark.parametrize("handler", [None, "charge", 42])
async def test_a_handler_that_is_not_callable_stores_nothing(
    harness: StoreHarness, handler: object
) -> None:
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError, match="handler must be callable") as info:
        await ledger.run(CALL, handler)  # type: ignore[call-overload]
    assert info.value.field == "handler"
    assert await harness.raw_count() == 0
    assert await ledger.run(CALL, lambda e: "charged") == "charged"
