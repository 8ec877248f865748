"""An outcome past a limit is recorded in a form every store holds, and the
handler runs once (issue 26 follow-up, finding 2; engine.limits).

A 70,000-character error code and a 200,000-character error message used to
reach the store as they were: MariaDB refused them (``TEXT`` too short, the
packet too big), the engine retried the commit until the lease ran out, and
the next caller ran the handler again. Now both are cut before the commit,
the same on every store, and a later caller gets the recorded failure.
"""

from __future__ import annotations

import pytest

from agent_ledger import EffectFailedError, EffectStatus, ToolCall
from agent_ledger.engine.deadline import Late, late_outcome
from agent_ledger.engine.limits import MAX_ERROR_CODE_CHARS, MAX_ERROR_MESSAGE_CHARS
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="report.build")


class LongCode(Exception):
    code = "c" * 70_000


async def test_a_long_error_code_is_cut_and_the_handler_runs_once(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[int] = []

    def build(effect: object) -> object:
        runs.append(1)
        raise LongCode("boom")

    with pytest.raises(LongCode):
        await ledger.run(CALL, build)
    with pytest.raises(EffectFailedError) as again:
        await ledger.run(CALL, build)
    assert runs == [1]
    stored = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert stored is not None and stored.status is EffectStatus.FAILED
    assert stored.error is not None and stored.error.code == "c" * MAX_ERROR_CODE_CHARS
    assert again.value.effect.error == stored.error


async def test_a_long_error_message_is_cut_with_a_note_and_the_handler_runs_once(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    runs: list[int] = []

    def build(effect: object) -> object:
        runs.append(1)
        raise RuntimeError("m" * 200_000)

    with pytest.raises(RuntimeError):
        await ledger.run(CALL, build)
    with pytest.raises(EffectFailedError):
        await ledger.run(CALL, build)
    assert runs == [1]
    stored = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert stored is not None and stored.error is not None
    kept = "m" * MAX_ERROR_MESSAGE_CHARS
    assert (
        stored.error.message
        == f"{kept}… [{200_000 - MAX_ERROR_MESSAGE_CHARS} more characters not stored]"
    )


@pytest.mark.parametrize("cancelled", [True, False])
def test_a_late_handlers_long_error_is_cut_too(cancelled: bool) -> None:
    late = Late(ran_ms=2_000.0, cancelled=cancelled, exc=RuntimeError("m" * 200_000))
    _, _, error = late_outcome(late, 1_000)
    assert len(error.message) < MAX_ERROR_MESSAGE_CHARS + 100
    assert error.message.endswith("more characters not stored]")
