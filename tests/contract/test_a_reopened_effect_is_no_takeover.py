"""A reopened effect runs again even under max_takeovers=0 (issue 26, item 3, adversarial pass).

``reopen()`` promises that the next call claims the effect and runs the
handler once. That claim adds an execution, and ``takeovers()`` read every
execution past the first as a takeover: under ``max_takeovers=0`` (and after
as many reopens as ``max_takeovers`` allows, by default 3) the reopened
effect was failed ``too_many_takeovers`` without running the handler
(reproduced 6 of 6 trials on MemoryStore and SqliteStore). A real takeover
after a reopen is still counted.
"""

from __future__ import annotations

import pytest

from agent_ledger import EffectStatus, RunOptions, ToolCall
from agent_ledger.codes import ErrorCode
from agent_ledger.options import StaleOptions
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="charge", args={"cents": 100})


@pytest.mark.parametrize("limit", [0, 1])
async def test_each_reopen_runs_the_handler_again_whatever_max_takeovers(
    harness: StoreHarness, limit: int
) -> None:
    ledger = harness.ledger()
    options = RunOptions(stale=StaleOptions(max_takeovers=limit))
    key = ledger.idem_key(CALL)
    runs: list[int] = []

    def failing(effect: object) -> None:
        runs.append(len(runs) + 1)
        raise RuntimeError("the provider was down")

    with pytest.raises(RuntimeError):
        await ledger.run(CALL, failing, options)
    for reopened in range(1, limit + 3):  # past max_takeovers reopens
        assert await ledger.reopen(key, by="ops", reason=f"fixed, take {reopened}")
        # Before the fix: EffectFailedError (too_many_takeovers), the handler not run.
        with pytest.raises(RuntimeError):
            await ledger.run(CALL, failing, options)
        assert runs[-1] == reopened + 1, "the handler ran again"
        effect = await harness.store.find(key)
        assert effect is not None and effect.error is not None
        assert effect.error.code != ErrorCode.TOO_MANY_TAKEOVERS
    assert await ledger.reopen(key, by="ops", reason="fixed for good")
    assert await ledger.run(CALL, lambda effect: "charged", options) == "charged"
    effect = await harness.store.find(key)
    assert effect is not None and effect.status is EffectStatus.SUCCEEDED
    assert effect.executions == len(runs) + 1
