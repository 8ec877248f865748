"""run(): fresh calls, replays, failures, and what gets recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import cast

import pytest

from agent_ledger import (
    Effect,
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerValidationError,
    EffectStatus,
    ToolCall,
)
from tests.approvals import make_pending
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="order-1", tool="stripe.charge", args={"amount": 1000})


class Counter:
    def __init__(self, result: object = None) -> None:
        self.calls = 0
        self.result = result

    async def __call__(self, effect: Effect) -> object:
        self.calls += 1
        return self.result


async def test_fresh_call_runs_the_handler_and_records_the_result(harness: StoreHarness) -> None:
    """The first run executes and stores a succeeded receipt with the result."""
    ledger = harness.ledger()
    handler = Counter({"charge_id": "ch_1"})
    assert await ledger.run(CALL, handler) == {"charge_id": "ch_1"}
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None
    assert handler.calls == 1
    assert effect.status is EffectStatus.SUCCEEDED
    assert effect.result == {"charge_id": "ch_1"}
    assert effect.args_canonical == '{"amount":1000}'
    assert (effect.attempt, effect.dedup_count, effect.error) == (1, 0, None)
    assert effect.completed_at is not None
    for stamp in (effect.created_at, effect.updated_at, effect.completed_at, effect.heartbeat_at):
        assert stamp.tzinfo is not None and stamp.utcoffset() == UTC.utcoffset(None)
    assert effect.created_at <= effect.completed_at


async def test_replay_returns_the_recorded_result_without_running(harness: StoreHarness) -> None:
    """A second run with the same call returns the receipt and bumps dedup_count."""
    ledger = harness.ledger()
    handler = Counter({"n": 1})
    first = await ledger.run(CALL, handler)
    second = await ledger.run(CALL, Counter({"n": 2}))
    assert first == second == {"n": 1}
    assert handler.calls == 1
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.dedup_count == 1


async def test_plain_function_handlers_work(harness: StoreHarness) -> None:
    """A sync handler is called directly and its value recorded."""
    ledger = harness.ledger()
    assert await ledger.run(CALL, lambda effect: ["sync", effect.attempt]) == ["sync", 1]
    # A replay returns the first run's result, whatever the type of this handler.
    assert cast(object, await ledger.run(CALL, lambda effect: "ignored")) == ["sync", 1]


async def test_handler_receives_the_owned_effect(harness: StoreHarness) -> None:
    """The handler sees its effect in processing, with its key and attempt."""
    ledger = harness.ledger()
    seen: list[Effect] = []
    await ledger.run(CALL, lambda effect: seen.append(effect))
    assert seen[0].status is EffectStatus.PROCESSING
    assert seen[0].idem_key == ledger.idem_key(CALL)
    assert seen[0].attempt == 1


class PaymentDeclined(Exception):
    code = "card_declined"


async def test_handler_exception_is_recorded_and_reraised(harness: StoreHarness) -> None:
    """The original exception propagates; the receipt holds its message and code."""
    ledger = harness.ledger()
    with pytest.raises(PaymentDeclined, match="insufficient funds"):
        await ledger.run(CALL, _raiser(PaymentDeclined("insufficient funds")))
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert effect.error is not None
    assert (effect.error.message, effect.error.code) == ("insufficient funds", "card_declined")


async def test_error_code_falls_back_to_the_class_name(harness: StoreHarness) -> None:
    """Without a code attribute, the exception's class name is the code."""
    ledger = harness.ledger()
    with pytest.raises(KeyError):
        await ledger.run(CALL, _raiser(KeyError("missing")))
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.error is not None
    assert effect.error.code == "KeyError"


async def test_replay_of_a_failure_raises_effect_failed(harness: StoreHarness) -> None:
    """A failed effect is not retried: replays raise EffectFailedError with the original error."""
    ledger = harness.ledger()
    with pytest.raises(PaymentDeclined):
        await ledger.run(CALL, _raiser(PaymentDeclined("nope")))
    handler = Counter()
    with pytest.raises(EffectFailedError) as info:
        await ledger.run(CALL, handler)
    assert (info.value.message, info.value.code) == ("nope", "card_declined")
    assert handler.calls == 0


async def test_non_json_result_is_recorded_failed_not_left_processing(
    harness: StoreHarness,
) -> None:
    """A result orjson cannot encode fails the effect with a clear code and raises."""
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError, match="result"):
        await ledger.run(CALL, lambda effect: {"when": object()})
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert effect.error is not None and effect.error.code == "result_not_serializable"
    with pytest.raises(EffectFailedError):
        await ledger.run(CALL, lambda effect: 1)


@pytest.mark.parametrize(
    "result",
    [
        None,
        0,
        -(2**63),
        2**64 - 1,
        1.5e-300,
        "ünïcødé ✓ \u2028 \x01 \U0001f600",
        {"nested": {"list": [1, "two", None, True, {"deep": []}]}},
        [],
        {},
    ],
)
async def test_results_round_trip_exactly(harness: StoreHarness, result: object) -> None:
    """Whatever JSON the handler returns comes back equal on replay."""
    ledger = harness.ledger()
    assert await ledger.run(CALL, lambda effect: result) == result
    assert await ledger.run(CALL, lambda effect: "other") == result


async def test_tuples_come_back_as_lists_on_replay(harness: StoreHarness) -> None:
    """Results are stored as JSON, so a replay decodes arrays as lists."""
    ledger = harness.ledger()
    assert await ledger.run(CALL, lambda effect: (1, 2)) == (1, 2)
    assert cast(object, await ledger.run(CALL, lambda effect: None)) == [1, 2]


async def test_replayed_results_are_independent_copies(harness: StoreHarness) -> None:
    """Mutating a returned result does not change the stored receipt."""
    ledger = harness.ledger()
    await ledger.run(CALL, lambda effect: {"items": [1]})
    replay = cast(dict[str, list[int]], await ledger.run(CALL, lambda effect: None))
    replay["items"].append(2)
    assert cast(object, await ledger.run(CALL, lambda effect: None)) == {"items": [1]}


async def test_denied_effect_raises_effect_denied(harness: StoreHarness) -> None:
    """After deny(), run() raises EffectDeniedError with the reason and never runs."""
    ledger = harness.ledger()
    pending = await make_pending(ledger, CALL)
    assert await ledger.deny(pending.idem_key, reason="over budget")
    handler = Counter()
    with pytest.raises(EffectDeniedError) as info:
        await ledger.run(CALL, handler)
    assert (info.value.status, info.value.reason) == (EffectStatus.DENIED, "over budget")
    assert handler.calls == 0


async def test_canceled_effect_raises_effect_denied(harness: StoreHarness) -> None:
    """A canceled effect also raises EffectDeniedError, with status canceled."""
    ledger = harness.ledger()
    begun = await ledger.begin(CALL)
    assert await ledger.cancel(begun.effect.idem_key, reason="agent stopped")
    with pytest.raises(EffectDeniedError) as info:
        await ledger.run(CALL, Counter())
    assert (info.value.status, info.value.reason) == (EffectStatus.CANCELED, "agent stopped")


async def test_distinct_calls_are_distinct_effects(harness: StoreHarness) -> None:
    """Different args, tools or workflows each run once."""
    ledger = harness.ledger()
    calls = [
        ToolCall(workflow_id="w", tool="t", args={"i": 1}),
        ToolCall(workflow_id="w", tool="t", args={"i": 2}),
        ToolCall(workflow_id="w", tool="u", args={"i": 1}),
        ToolCall(workflow_id="v", tool="t", args={"i": 1}),
    ]
    handler = Counter("ok")
    for call in calls:
        await ledger.run(call, handler)
    assert handler.calls == 4
    assert await harness.raw_count() == 4


def _raiser(exc: BaseException) -> Callable[[Effect], Awaitable[None]]:
    async def handler(effect: Effect) -> None:
        await asyncio.sleep(0)
        raise exc

    return handler


async def test_unstorable_text_in_an_error_is_replaced_not_lost(harness: StoreHarness) -> None:
    """A handler error whose message has NUL or lone surrogates is still recorded."""
    ledger = harness.ledger()
    with pytest.raises(RuntimeError):
        await ledger.run(CALL, _raiser(RuntimeError("bad\x00byte \ud800 here")))
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.error is not None
    assert effect.error.message == "bad\ufffdbyte \ufffd here"


@pytest.mark.parametrize("number", [1e16, -0.0, 6.051451965959453e16, 1.5e-300, 2.0, 1e300])
async def test_floats_round_trip_exactly(harness: StoreHarness, number: float) -> None:
    """A float result comes back as the same float, not as an int or a rounded decimal."""
    ledger = harness.ledger()
    call = ToolCall(workflow_id="w", tool="t", args={"n": repr(number)})
    await ledger.run(call, lambda effect: {"x": number})
    replayed = cast(dict[str, object], await ledger.run(call, lambda effect: None))
    assert type(replayed["x"]) is float
    assert repr(replayed["x"]) == repr(number)
