"""What a saga compensates, how it rolls back and how recovery finishes it.

A saga compensates only what it keyed under its own id; an inner saga's failure
rolls the outer one back; recovery moves past a step that cannot be taken over;
a re-run that reaches fewer steps leaves the saga running; a store error while
undoing leaves it compensating; tools called from a compensation or a step are
ordinary effects. Every store through the harness. (Found by issue 12's
adversarial scripts, a01..a16, made deterministic here.)
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agent_ledger import (
    Effect,
    EffectLedgerValidationError,
    EffectStoreError,
    RunOptions,
)
from agent_ledger.options import StaleOptions
from agent_ledger.sagas import (
    Saga,
    SagaFailed,
    SagaNondeterminismError,
    SagaOutcome,
    SagaStatus,
)
from agent_ledger.sagas._saga import rolled_back, saga_store
from tests.harness import StoreHarness
from tests.sagas.conftest import shop_of

G = SagaStatus
LEASE = 1_000


async def _status(harness: StoreHarness, saga_id: str) -> SagaStatus | None:
    saga = await saga_store(harness.ledger()).get_saga(saga_id)
    return None if saga is None else saga.status


async def _die(saga: Saga) -> None:
    """The owner stops heartbeating and never returns (as after a SIGKILL)."""
    assert saga._heartbeat is not None
    saga._heartbeat.stop()
    for token in reversed(saga._tokens):
        token.var.reset(token)
    saga._scope.__exit__(None, None, None)


# -- 1. a saga only compensates effects keyed under its own id (a01) --------------


async def test_a_compensable_tool_keyed_under_another_workflow_is_refused(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    ran: list[str] = []

    @ledger.tool("acct.open", compensate="acct.close", workflow_id="accounts")
    async def open_account(user: str) -> str:
        ran.append(f"open {user}")
        return f"acct-{user}"

    @ledger.tool("acct.close")
    async def close_account(forward: Effect) -> str:
        ran.append(f"close {forward.result}")
        return "closed"

    shop = shop_of(ledger, "s1")
    for saga_id in ("saga-a", "saga-b"):
        with pytest.raises(SagaFailed) as failed:
            async with ledger.saga(saga_id):
                await open_account("u1")
        cause = failed.value.__cause__
        assert isinstance(cause, EffectLedgerValidationError) and cause.field == "workflow_id"
        assert "'accounts'" in str(cause) and "Nothing was run" in str(cause)
    # A ledger.workflow() block inside the saga, and saga.start(), likewise.
    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("saga-c"):
            with ledger.workflow("elsewhere"):
                await shop["s1"]("x")
    assert isinstance(failed.value.__cause__, EffectLedgerValidationError)
    with pytest.raises(SagaFailed):
        async with ledger.saga("saga-d") as saga, saga.parallel():
            with pytest.raises(EffectLedgerValidationError, match="accounts"):
                saga.start(open_account, "u2")
            raise RuntimeError("the refusal came before any task started")
    # The plan form refuses it before the saga exists.
    with pytest.raises(EffectLedgerValidationError, match="pinned to workflow 'accounts'"):
        await ledger.run_saga("saga-e", [{"tool": "acct.open", "args": {"user": "u3"}}])
    assert await _status(harness, "saga-e") is None
    assert ran == [] and shop.log == []


async def test_a_tool_without_compensation_may_still_be_pinned(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    sent: list[str] = []

    @ledger.tool("notify", workflow_id="mail")
    async def notify(text: str) -> str:
        sent.append(text)
        return "sent"

    for saga_id in ("n-1", "n-2"):
        async with ledger.saga(saga_id):
            await notify("hello")
    assert sent == ["hello"], "one effect for both sagas: the pin's purpose"


# -- 2. an inner saga's failure is a failed step of the outer one (a05) -----------


async def test_an_inner_sagas_failure_rolls_the_outer_saga_back(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge", "reserve")
    shop.failing.add("reserve")
    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("outer-1"):
            await shop["charge"]("o")
            async with ledger.saga("inner-1"):
                await shop["reserve"]("A")
    assert failed.value.saga_id == "outer-1" and failed.value.status is G.COMPENSATED
    inner = failed.value.__cause__
    assert isinstance(inner, SagaFailed) and inner.saga_id == "inner-1"
    assert shop.log == ["charge", "reserve", "undo charge"]
    assert await _status(harness, "inner-1") is G.COMPENSATED


# -- 3. a step whose worker disabled takeover does not hang recovery (a10) --------


async def test_recovery_moves_past_a_step_that_can_never_be_taken_over(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge")
    release = asyncio.Event()

    @ledger.tool("long_job", run_options=RunOptions(stale=StaleOptions(after_ms=0)))
    async def long_job(n: int) -> str:
        await release.wait()
        return "done"

    stuck = ledger.saga("a-long-job", lease_ms=LEASE, abandon_after=timedelta(0))
    await stuck.__aenter__()
    await shop["charge"]("a")
    job = asyncio.create_task(long_job(1))
    while (steps := await saga_store(ledger).saga_steps("a-long-job")) and len(steps) < 2:
        await asyncio.sleep(0.01)
    await _die(stuck)
    plain = ledger.saga("b-ordinary", lease_ms=LEASE, abandon_after=timedelta(0))
    await plain.__aenter__()
    await shop["charge"]("b")
    await _die(plain)
    await harness.age(LEASE * 3)
    try:
        report = await asyncio.wait_for(ledger.recover_sagas(), 30)
    finally:
        release.set()
        await asyncio.gather(job, return_exceptions=True)
    assert [o.saga_id for o in report.finished] == ["b-ordinary"]
    [(saga_id, why)] = report.errors
    assert saga_id == "a-long-job" and "StaleOptions(after_ms=0)" in why
    assert await _status(harness, "a-long-job") is G.COMPENSATING


# -- 4. a re-run that stops short of the recorded steps (a11) ---------------------


async def test_a_re_run_that_reaches_fewer_steps_leaves_the_saga_running(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge", "reserve")
    first = ledger.saga("short-1", lease_ms=LEASE)
    await first.__aenter__()
    await shop["charge"]("o")
    await shop["reserve"]("A")
    await _die(first)
    await harness.age(LEASE * 2)
    with pytest.raises(SagaNondeterminismError) as diverged:
        async with ledger.saga("short-1", lease_ms=LEASE):
            await shop["charge"]("o")  # the changed code no longer reserves
    assert diverged.value.position == 1 and "'reserve'" in str(diverged.value)
    assert "left running" in str(diverged.value)
    assert await _status(harness, "short-1") is G.RUNNING
    assert shop.log == ["charge", "reserve"], "nothing undone, nothing run again"
    await harness.age(LEASE * 2)
    async with ledger.saga("short-1", lease_ms=LEASE):  # the code that reaches it
        await shop["charge"]("o")
        await shop["reserve"]("A")
    assert await _status(harness, "short-1") is G.COMPLETED
    assert shop.log == ["charge", "reserve"]


# -- 5. a store error while undoing is not a failed compensation (a15) ------------


async def test_a_store_error_beginning_a_compensation_leaves_the_saga_compensating(
    harness: StoreHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge", "ship")
    shop.failing.add("ship")
    store: Any = harness.store
    begin = store.begin
    blips = [1]

    async def flaky_begin(new: Any, **kw: Any) -> Any:
        if new.tool == "undo.charge" and blips:
            blips.pop()
            raise EffectStoreError("connection reset by peer", operation="begin")
        return await begin(new, **kw)

    monkeypatch.setattr(store, "begin", flaky_begin)
    with pytest.raises(EffectStoreError, match="connection reset"):
        async with ledger.saga("blip-1", lease_ms=LEASE):
            await shop["charge"]("o")
            await shop["ship"]("o")
    assert await _status(harness, "blip-1") is G.COMPENSATING
    assert shop.log == ["charge", "ship"]
    await harness.age(LEASE * 2)
    report = await ledger.recover_sagas()
    assert [(o.saga_id, o.status) for o in report.finished] == [("blip-1", G.COMPENSATED)]
    assert shop.log == ["charge", "ship", "undo charge"]


def test_compensation_failed_without_a_failed_undo_says_where_to_look() -> None:
    from datetime import UTC, datetime

    outcome = SagaOutcome("s", G.COMPENSATION_FAILED, None, (), datetime.now(UTC), None, None, 1)
    message = str(rolled_back(outcome))
    assert "?" not in message and "agent-ledger sagas show" in message


# -- 6, 7. tools called from a compensation or a step are ordinary effects --------


async def test_a_compensation_may_call_another_tool(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "charge", "ship")
    shop.failing.add("ship")
    sent: list[str] = []

    @ledger.tool("notify")
    async def notify(text: str) -> str:
        sent.append(text)
        return "sent"

    @ledger.tool("pay", compensate="pay.refund")
    async def pay(amount: int) -> str:
        return "ch_1"

    @ledger.tool("pay.refund")
    async def refund(forward: Effect) -> str:
        await notify(f"refunded {forward.result}")
        return "refunded"

    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("s-notify"):
            await pay(10)
            await shop["ship"]("o")
    assert failed.value.status is G.COMPENSATED
    assert sent == ["refunded ch_1"]
    assert [s.tool for s in failed.value.outcome.steps] == ["pay", "ship"]


async def test_a_tool_called_by_a_steps_handler_is_not_a_step(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    log: list[str] = []

    @ledger.tool("audit.write")
    async def audit(text: str) -> str:
        log.append(f"audit {text}")
        return "ok"

    @ledger.tool("book")
    async def book(item: str) -> str:
        log.append(f"book {item}")
        await audit(f"booked {item}")
        return f"b-{item}"

    @ledger.tool("ship")
    async def ship(item: str) -> str:
        log.append(f"ship {item}")
        return f"s-{item}"

    async def code() -> list[str]:
        async with ledger.saga("nested-1") as saga:
            async with saga.parallel():
                started = saga.start(book, "y")
            return [await book("x"), started.result(), await ship("x")]

    assert await code() == ["b-x", "b-y", "s-x"]
    steps = await saga_store(ledger).saga_steps("nested-1")
    assert [s.tool for s in steps] == ["book", "book", "ship"]
    assert await code() == ["b-x", "b-y", "s-x"], "the replay calls no handler"
    assert sorted(log) == sorted(["book y", "audit booked y", "book x", "audit booked x", "ship x"])
