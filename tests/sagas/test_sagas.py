"""Sagas on every store: reverse-order undo, replay, groups, approvals, failure
scopes, compensation policies and cancellation (issue 12's Tests section, but
the crash tests, which are in tests/reliability/)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agent_ledger import EffectLedgerValidationError, EffectStatus
from agent_ledger.sagas import (
    SagaCompensationFailed,
    SagaFailed,
    SagaInFlightError,
    SagaNondeterminismError,
    SagaOwnershipLostError,
    SagaStatus,
    SagaStepCancelled,
)
from agent_ledger.sagas._compensation import compensate
from agent_ledger.sagas._saga import saga_store
from tests.harness import StoreHarness
from tests.sagas.conftest import Declined, shop_of

G = SagaStatus


async def _status(harness: StoreHarness, saga_id: str) -> SagaStatus:
    saga = await saga_store(harness.ledger()).get_saga(saga_id)
    assert saga is not None
    return saga.status


async def test_a_failing_fourth_step_undoes_three_two_one(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2", "s3", "s4")
    shop.failing.add("s4")
    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("order-42"):
            for name in ("s1", "s2", "s3", "s4"):
                await shop[name]("o42")
    assert shop.log == ["s1", "s2", "s3", "s4", "undo s3", "undo s2", "undo s1"]
    assert isinstance(failed.value.__cause__, Declined)
    outcome = failed.value.outcome
    assert outcome.status is G.COMPENSATED and await _status(harness, "order-42") is G.COMPENSATED
    assert outcome.error is not None and outcome.error.code == "declined"
    assert [s.tool for s in outcome.compensated] == ["s3", "s2", "s1"]
    for step in outcome.steps[:3]:
        # Each undo is an effect keyed from its forward key, and got the forward effect.
        assert step.forward is not None and step.compensation is not None
        assert step.compensation.args == {"forward": step.forward.idem_key}
        assert step.compensation.idem_key == step.step.compensation_key
        assert shop.forwards[step.tool].idem_key == step.forward.idem_key
        assert shop.forwards[step.tool].result == {"done": f"{step.tool}:o42"}
    last = outcome.steps[3]
    assert last.forward_status is EffectStatus.FAILED and last.compensation is None


async def test_a_saga_that_completes_and_its_replay_calls_no_handler(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")

    async def order() -> list[object]:
        async with ledger.saga("order-7"):
            return [await shop["s1"]("a"), await shop["s2"]("b")]

    first = await order()
    assert await _status(harness, "order-7") is G.COMPLETED
    assert await order() == first, "replayed from the receipts"
    assert shop.log == ["s1", "s2"]


async def test_a_changed_step_raises_nondeterminism_and_runs_nothing(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2", "s3")
    async with ledger.saga("order-8"):
        await shop["s1"]("a")
        await shop["s2"]("b")
    with pytest.raises(SagaNondeterminismError, match=r"step 1 was recorded as tool 's2'"):
        async with ledger.saga("order-8"):
            await shop["s1"]("a")
            await shop["s3"]("b")
    with pytest.raises(SagaNondeterminismError, match="step 1"):
        async with ledger.saga("order-8"):
            await shop["s1"]("a")
            await shop["s2"]("changed")
    with pytest.raises(SagaNondeterminismError, match="completed with 2 steps"):
        async with ledger.saga("order-8"):
            for name, item in (("s1", "a"), ("s2", "b"), ("s3", "c")):
                await shop[name](item)
    assert shop.log == ["s1", "s2"]
    assert await _status(harness, "order-8") is G.COMPLETED


async def test_re_running_a_rolled_back_saga_raises_its_outcome_and_runs_nothing(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    shop.failing.add("s2")
    for _ in range(2):
        with pytest.raises(SagaFailed) as failed:
            async with ledger.saga("order-9"):
                await shop["s1"]("a")
                await shop["s2"]("b")
        assert failed.value.status is G.COMPENSATED
    assert shop.log == ["s1", "s2", "undo s1"]


async def test_a_parallel_group_is_undone_only_after_its_running_siblings_end(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "pay")
    a_may_end = asyncio.Event()
    log = shop.log

    @ledger.tool("A", compensate="undo.A")
    async def slow_a(item: str) -> str:
        log.append("A starts")
        await a_may_end.wait()
        log.append("A ends")
        return "a"

    @ledger.tool("B", compensate="undo.B")
    async def failing_b(item: str) -> str:
        log.append("B fails")
        asyncio.get_running_loop().call_later(0.05, a_may_end.set)
        raise Declined("no stock")

    @ledger.tool("C", compensate="undo.C")
    async def quick_c(item: str) -> str:
        log.append("C")
        return "c"

    for name in "ABC":

        async def undo(forward: object, name: str = name) -> None:
            log.append(f"undo {name}")

        ledger.tool(f"undo.{name}")(undo)
    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("group") as saga:
            await shop["pay"]("x")
            async with saga.parallel():
                saga.start(slow_a, "1")
                saga.start(failing_b, "2")
                saga.start(quick_c, "3")
    assert log.index("A ends") < min(log.index("undo A"), log.index("undo C"))
    assert "undo B" not in log, "B failed and is compensated only if it says 'attempted'"
    assert log[-1] == "undo pay", "the earlier group is undone after the parallel one"
    steps = failed.value.outcome.steps
    assert [s.step.group_index for s in steps] == [0, 1, 1, 1]


async def test_a_group_sibling_waiting_for_approval_is_canceled(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "A")
    shop.add("B")
    shop.add("C", requires_approval=True)
    shop.failing.add("B")
    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("approvals") as saga, saga.parallel():
            saga.start(shop["A"], "1")
            saga.start(shop["C"], "3")
            await asyncio.sleep(0.05)  # C is now waiting for a person
            saga.start(shop["B"], "2")
    c = next(s for s in failed.value.outcome.steps if s.tool == "C")
    assert c.forward_status is EffectStatus.CANCELED and c.compensation is None
    assert c.forward is not None and not await ledger.approve(c.forward.idem_key)
    assert "C" not in shop.log and "undo A" in shop.log


async def test_compensate_if_attempted_undoes_the_failed_step_too(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1")
    shop.add("charge", compensate_if="attempted")
    shop.failing.add("charge")
    with pytest.raises(SagaFailed):
        async with ledger.saga("attempted"):
            await shop["s1"]("a")
            await shop["charge"]("b")
    assert shop.log == ["s1", "charge", "undo charge", "undo s1"]


async def test_a_step_scoped_failure_is_recorded_and_the_saga_goes_on(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s3")
    shop.add("notify", failure_scope="step")
    shop.failing.add("notify")
    async with ledger.saga("scoped") as saga:
        await shop["s1"]("a")
        assert await shop["notify"]("b") is None
        await shop["s3"]("c")
    assert [(p, type(e)) for p, e in saga.step_failures] == [(1, Declined)]
    assert await _status(harness, "scoped") is G.COMPLETED
    assert shop.log == ["s1", "notify", "s3"]


async def test_a_compensation_that_keeps_failing_ends_compensation_failed(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2", "s3")
    shop.failing.add("s3")
    shop.undo_fails.add("s2")
    with pytest.raises(SagaCompensationFailed, match=r"step\(s\) 1 \(s2\)") as failed:
        async with ledger.saga("stuck"):
            for name in ("s1", "s2", "s3"):
                await shop[name]("x")
    # Three tries (the undo tool's policy); the other undo is still attempted.
    assert shop.log == ["s1", "s2", "s3", "undo s2", "undo s2", "undo s2", "undo s1"]
    outcome = failed.value.outcome
    assert outcome.status is G.COMPENSATION_FAILED
    [stuck] = outcome.failed_compensations
    assert stuck.compensation is not None and stuck.compensation.tries == 3
    listed = await saga_store(ledger).list_sagas(statuses=frozenset({G.COMPENSATION_FAILED}))
    assert [s.saga_id for s in listed] == ["stuck"]


async def test_on_compensation_failure_stop_leaves_earlier_groups_alone(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2", "s3")
    shop.failing.add("s3")
    shop.undo_fails.add("s2")
    with pytest.raises(SagaCompensationFailed):
        async with ledger.saga("stop", on_compensation_failure="stop"):
            for name in ("s1", "s2", "s3"):
                await shop[name]("x")
    assert "undo s1" not in shop.log
    assert await _status(harness, "stop") is G.COMPENSATION_FAILED


async def test_compensation_without_a_retry_policy_gets_the_default(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    tries: list[int] = []

    @ledger.tool("book", compensate="unbook")
    async def book(item: str) -> str:
        return item

    @ledger.tool("unbook")
    async def unbook(forward: object) -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("flaky")
        return "ok"

    @ledger.tool("boom")
    async def boom() -> None:
        raise Declined("boom")

    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("default-retry"):
            await book("x")
            await boom()
    assert len(tries) == 3 and failed.value.status is G.COMPENSATED


async def test_cancelling_the_task_compensates_then_propagates(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    hanging = asyncio.Event()

    @ledger.tool("hang", compensate="undo.s1")
    async def hang() -> None:
        hanging.set()
        await asyncio.Event().wait()

    async def order() -> None:
        async with ledger.saga("cancel-me"):
            await shop["s1"]("a")
            await shop["s2"]("b")
            await hang()

    task = asyncio.create_task(order())
    await hanging.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert shop.log == ["s1", "s2", "undo s2", "undo s1"]
    assert await _status(harness, "cancel-me") is G.CANCELED


async def test_a_live_owner_keeps_the_saga_and_a_dead_one_is_taken_over(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    first = ledger.saga("owned", lease_ms=1_000)
    await first.__aenter__()
    await shop["s1"]("a")
    with pytest.raises(SagaInFlightError, match="another worker"):
        async with ledger.saga("owned"):
            pass
    await harness.age(2_000)
    async with ledger.saga("owned") as second:
        assert second.attempt == 2
        await shop["s1"]("a")  # replayed from its receipt
        # The first owner is fenced: it can record no step.
        with pytest.raises(SagaOwnershipLostError):
            await first.run_step(shop["s2"], shop["s2"].tool_call("b"), lambda e: 1, None, None)
        await shop["s2"]("b")
    assert shop.log == ["s1", "s2"]
    assert await _status(harness, "owned") is G.COMPLETED
    with pytest.raises(SagaOwnershipLostError):
        await first.__aexit__(None, None, None)


async def test_a_compensation_runs_once_however_many_finish_the_saga(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    shop.failing.add("s2")
    with pytest.raises(SagaFailed):
        async with ledger.saga("once"):
            await shop["s1"]("a")
            await shop["s2"]("b")
    steps = await saga_store(ledger).saga_steps("once")
    again = await asyncio.gather(
        *(compensate(ledger, "once", steps, stop_on_failure=False) for _ in range(3))
    )
    assert all(u.undone for run in again for u in run if u.step.position == 0)
    assert shop.log.count("undo s1") == 1


async def test_an_unregistered_compensation_is_refused_before_the_step_runs(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    ran: list[str] = []

    @ledger.tool("orphan", compensate="nobody")
    async def orphan() -> None:
        ran.append("orphan")

    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga("orphan"):
            await orphan()
    assert isinstance(failed.value.__cause__, EffectLedgerValidationError)
    assert "'nobody', which is not registered" in str(failed.value.__cause__)
    assert ran == [] and failed.value.outcome.steps == ()


async def test_bad_saga_settings_are_refused_at_once() -> None:
    from agent_ledger import MemoryStore
    from agent_ledger.testing import build_ledger

    ledger = build_ledger(MemoryStore())
    with pytest.raises(EffectLedgerValidationError, match="compensate_if must be"):
        ledger.tool("x", compensate="y", compensate_if="always")  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="failure_scope must be"):
        ledger.tool("x", failure_scope="everything")  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="cannot compensate itself"):
        ledger.tool("x", compensate="x")
    with pytest.raises(EffectLedgerValidationError, match="on_compensation_failure"):
        ledger.saga("s", on_compensation_failure="retry")  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="abandon_after"):
        ledger.saga("s", abandon_after=timedelta(seconds=-1))
    with pytest.raises(EffectLedgerValidationError, match="lease_ms"):
        ledger.saga("s", lease_ms=0)
    assert await saga_store(ledger).list_sagas() == []


async def test_tools_outside_a_saga_are_unchanged(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1")
    async with ledger.workflow("plain"):
        assert await shop["s1"]("a") == {"done": "s1:a"}
    assert await saga_store(ledger).list_sagas() == []


async def test_a_cancellation_during_the_undo_waits_for_it_then_propagates(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    shop.failing.add("s2")
    undoing = asyncio.Event()
    may_finish = asyncio.Event()

    @ledger.tool("s0", compensate="undo.slow")
    async def s0() -> str:
        return "ok"

    @ledger.tool("undo.slow")
    async def slow_undo(forward: object) -> str:
        undoing.set()
        await may_finish.wait()
        shop.log.append("undo s0")
        return "done"

    async def order() -> None:
        async with ledger.saga("cancel-during-undo"):
            await s0()
            await shop["s1"]("a")
            await shop["s2"]("b")

    task = asyncio.create_task(order())
    await undoing.wait()
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done(), "the undo goes on"
    may_finish.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert shop.log == ["s1", "s2", "undo s1", "undo s0"]
    assert await _status(harness, "cancel-during-undo") is G.COMPENSATED


async def test_a_cancellation_while_the_exit_waits_for_a_stray_step_still_rolls_back(
    harness: StoreHarness,
) -> None:
    """The block's code is done; its end waits for a step started outside
    parallel(). Cancelling then used to leave the saga running, nothing undone."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    started = asyncio.Event()
    may_finish = asyncio.Event()

    @ledger.tool("stray", compensate="undo.s2")
    async def stray() -> str:
        started.set()
        await may_finish.wait()
        shop.log.append("stray")
        return "sent"

    async def order() -> None:
        async with ledger.saga("stray-cancel") as saga:
            await shop["s1"]("a")
            saga.start(stray)

    task = asyncio.create_task(order())
    await started.wait()
    await asyncio.sleep(0.02)  # the block's end is waiting for the stray step
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done(), "the undo waits for the stray step to end"
    may_finish.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert shop.log == ["s1", "stray", "undo s2", "undo s1"]
    assert await _status(harness, "stray-cancel") is G.CANCELED


@pytest.mark.parametrize("grouped", [True, False], ids=["in a group", "stray"])
async def test_a_cancelled_step_task_is_a_failed_step_and_rolls_the_saga_back(
    harness: StoreHarness, grouped: bool
) -> None:
    """A step task cancelled on its own (a wait_for timing out on it) used to
    raise a SagaError that left the saga running, its completed steps never undone."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1")
    started = asyncio.Event()

    @ledger.tool("slow.quote")
    async def quote() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    with pytest.raises(SagaFailed) as failed:
        async with ledger.saga(f"cancelled-step-{grouped}") as saga:
            await shop["s1"]("a")
            if grouped:
                async with saga.parallel():
                    slow = saga.start(quote)
                    await started.wait()
                    slow.cancel()
            else:
                slow = saga.start(quote)
                await started.wait()
                slow.cancel()
    assert isinstance(failed.value.__cause__, SagaStepCancelled)
    assert failed.value.__cause__.position == 1
    assert failed.value.status is G.COMPENSATED
    assert failed.value.outcome.error is not None
    assert failed.value.outcome.error.code == "step_canceled"
    assert shop.log == ["s1", "undo s1"]
    assert await _status(harness, f"cancelled-step-{grouped}") is G.COMPENSATED


class _Died(BaseException):
    """The worker stops mid-saga (left to recovery, as after a KeyboardInterrupt)."""


@pytest.mark.parametrize("changed_args", [True, False], ids=["changed args", "changed tool"])
async def test_nondeterminism_in_a_group_runs_no_sibling_and_leaves_the_saga(
    harness: StoreHarness, changed_args: bool
) -> None:
    """A changed step inside a parallel group used to let its new sibling be
    recorded and run (a charge nobody would undo)."""
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2", "s3")
    with pytest.raises(_Died):
        async with ledger.saga("group-8", lease_ms=1_000) as saga:
            await shop["s1"]("a")
            await shop["s2"]("b")
            # a group whose step 3 was recorded, step 2 not yet, when the worker died
            key = ledger.idem_key(shop["s2"].tool_call("c"))
            await saga._record(3, 2, shop["s2"], key, None)
            raise _Died
    await harness.age(2_000)
    before = await saga_store(ledger).saga_steps("group-8")
    with pytest.raises(SagaNondeterminismError, match=r"step 3 was recorded as tool 's2'"):
        async with ledger.saga("group-8", lease_ms=1_000) as saga:
            await shop["s1"]("a")
            await shop["s2"]("b")
            async with saga.parallel():
                late = saga.start(shop["s1"], "late")  # position 2, before the check: new
                with pytest.raises(SagaNondeterminismError):  # position 3: was s2("c")
                    saga.start(shop["s2"] if changed_args else shop["s3"], "changed")
                saga.start(shop["s3"], "new")  # position 4: new
            pytest.fail(f"the group raises: {late}")
    assert shop.log == ["s1", "s2"], "nothing ran in the re-run, not even step 2"
    assert await saga_store(ledger).saga_steps("group-8") == before, "nothing recorded"
    assert await _status(harness, "group-8") is G.RUNNING, "left as it was"


@pytest.mark.parametrize("invoke", [False, True], ids=["start", "start_invoke"])
async def test_start_refuses_arguments_that_are_not_json_before_anything_is_stored(
    harness: StoreHarness, invoke: bool
) -> None:
    ledger = harness.ledger()
    shop = shop_of(ledger, "s1", "s2")
    async with ledger.saga("bad-start") as saga, saga.parallel():
        saga.start(shop["s1"], "a")
        with pytest.raises(EffectLedgerValidationError, match="set is not a JSON value"):
            if invoke:
                saga.start_invoke(shop["s2"], {"item": {"x"}})
            else:
                saga.start(shop["s2"], {"x"})
        saga.start(shop["s2"], "b")  # the refused call took no position
    steps = await saga_store(ledger).saga_steps("bad-start")
    assert [(s.position, s.tool) for s in steps] == [(0, "s1"), (1, "s2")]
    assert sorted(shop.log) == ["s1", "s2"]
    assert await _status(harness, "bad-start") is G.COMPLETED
