"""A handler's result past a limit is recorded so that it replays honestly (issue 26, item 6).

The limits are concepts.md's table.
The side effect has happened by then: the effect is recorded ``failed``
with code ``result_not_serializable``, one execution, and the reason
(which limit, where); the first caller gets ``EffectLedgerValidationError``
(``field="result"``) and every later caller the recorded failure, with no
handler run again.
"""

from __future__ import annotations

import pytest

from agent_ledger import (
    EffectFailedError,
    EffectLedgerValidationError,
    EffectStatus,
    JSONValue,
    ToolCall,
)
from agent_ledger.keys import MAX_DEPTH
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="report.build")


def nested(levels: int) -> JSONValue:
    value: JSONValue = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        pytest.param(nested(MAX_DEPTH + 2), "nested deeper than 128 levels", id="130-levels"),
        pytest.param({"n": 2**64}, "does not fit in 64 bits", id="big-int"),
        pytest.param({"x": float("nan")}, "NaN", id="nan"),
    ],
)
async def test_a_result_past_a_limit_replays_as_the_failure_it_was_recorded_as(
    harness: StoreHarness, result: object, reason: str
) -> None:
    ledger = harness.ledger()
    runs: list[int] = []

    def build(effect: object) -> object:
        runs.append(1)
        return result

    with pytest.raises(EffectLedgerValidationError, match=reason) as first:
        await ledger.run(CALL, build)
    assert first.value.field == "result"
    stored = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert stored is not None and stored.status is EffectStatus.FAILED
    assert stored.executions == 1  # it ran: the receipt says so
    assert stored.error is not None and stored.error.code == "result_not_serializable"
    assert reason in stored.error.message
    with pytest.raises(EffectFailedError) as replay:
        await ledger.run(CALL, build)
    assert replay.value.code == "result_not_serializable" and reason in str(replay.value)
    assert runs == [1]


async def test_a_result_at_the_depth_limit_is_stored_and_replayed(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    deepest = nested(MAX_DEPTH)
    assert await ledger.run(CALL, lambda effect: deepest) == deepest
    assert await ledger.run(CALL, lambda effect: "not run") == deepest
