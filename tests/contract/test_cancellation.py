"""Cancellation: a cancelled handler is recorded, never left in processing."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import Effect, EffectDeniedError, EffectFailedError, EffectStatus, ToolCall
from tests.harness import StoreHarness

CALL = ToolCall(workflow_id="wf", tool="slow.tool", args={})


async def test_cancelled_handler_is_recorded_canceled(harness: StoreHarness) -> None:
    """Cancelling run() mid-handler records canceled, then lets CancelledError propagate."""
    ledger = harness.ledger()
    started = asyncio.Event()

    async def slow(effect: Effect) -> None:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(ledger.run(CALL, slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.CANCELED
    assert effect.error is not None and effect.error.code == "cancelled"
    assert "whether the side effect happened is unknown" in effect.error.message
    with pytest.raises(EffectDeniedError):
        await ledger.run(CALL, lambda e: "again")


async def test_timeout_around_run_records_the_cancellation(harness: StoreHarness) -> None:
    """asyncio.timeout() around run() is a cancellation like any other.

    The deadline is set to expire once the handler runs (a fixed delay could
    expire before, on a busy host: that is a cancel before the handler, which
    releases the claim instead, pinned in test_cancel_before_handler.py)."""
    ledger = harness.ledger()

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(None) as deadline:

            async def slow(effect: Effect) -> None:
                deadline.reschedule(asyncio.get_running_loop().time())
                await asyncio.sleep(60)

            await ledger.run(CALL, slow)
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and effect.status is EffectStatus.CANCELED


@pytest.mark.parametrize("outcome", ["returned", "raised"])
async def test_cancelled_while_recording_the_outcome_still_records_it(
    harness: StoreHarness, outcome: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler ran; a cancel that lands while its outcome is being written waits
    for the write, then propagates. The effect is never left processing for a re-run."""
    ledger = harness.ledger()
    store = harness.store
    original = store.commit
    writing = asyncio.Event()

    async def slow_write(*args: object, **kwargs: object) -> bool:
        writing.set()
        await asyncio.sleep(0.05)
        return await original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "commit", slow_write)
    executions = 0

    def charge(effect: Effect) -> str:
        nonlocal executions
        executions += 1
        if outcome == "raised":
            raise RuntimeError("card declined")
        return "ch_1"

    task = asyncio.create_task(ledger.run(CALL, charge))
    await writing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None
    expected = EffectStatus.SUCCEEDED if outcome == "returned" else EffectStatus.FAILED
    assert effect.status is expected
    monkeypatch.undo()
    if outcome == "returned":
        assert await ledger.run(CALL, charge) == "ch_1"
    else:
        with pytest.raises(EffectFailedError, match="card declined"):
            await ledger.run(CALL, charge)
    assert executions == 1


async def test_a_write_that_landed_before_the_cancel_is_recognised_as_ours(
    harness: StoreHarness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit lands, the cancel interrupts its reply: the repeated write finds the
    effect already ours (read back), not "rejected by another attempt"."""
    ledger = harness.ledger()
    store = harness.store
    original = store.commit
    replying = asyncio.Event()

    async def slow_reply(*args: object, **kwargs: object) -> bool:
        won = await original(*args, **kwargs)  # type: ignore[arg-type]
        replying.set()
        await asyncio.sleep(0.05)
        return won

    monkeypatch.setattr(store, "commit", slow_reply)
    task = asyncio.create_task(ledger.run(CALL, lambda e: "ch_1"))
    await replying.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    effect = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert effect is not None and (effect.status, effect.attempt) == (EffectStatus.SUCCEEDED, 1)
    assert not [r for r in caplog.records if "commit rejected" in r.getMessage()]
