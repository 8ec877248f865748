"""The ledger's OpenTelemetry metrics count each event exactly once, by the step that made it.

A scripted scenario on a MemoryStore with a manual clock (so approval waits are
exact), read through the SDK's InMemoryMetricReader."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerOptions,
    MemoryStore,
    RunOptions,
    SqliteStore,
    ToolCall,
    metrics,
)
from agent_ledger.approvals import Channel, DecisionAction
from agent_ledger.clock import ManualClock
from agent_ledger.deciding import approval_store, decide, effect_intent, expire_overdue
from agent_ledger.decisions import cancel_if_waiting
from agent_ledger.effects import CommitSucceeded, Effect, EffectError
from agent_ledger.options import StaleOptions
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import EffectQuery, Store
from tests.metric_readings import Histogram, Readings, readings, series

__all__ = ["readings"]

LEASE = RunOptions(stale=StaleOptions(after_ms=60_000))
ASK = RunOptions(requires_approval=True, wait_for_approval=False)


Workers = tuple[ManualClock, Store, EffectLedger, EffectLedger]


@pytest.fixture(params=["memory", "sqlite"])
async def workers(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Workers]:
    """A store on a manual clock, and two workers (ledgers) on it."""
    clock = ManualClock()
    store: Store = (
        MemoryStore(clock=clock)
        if request.param == "memory"
        else SqliteStore(tmp_path / "ledger.db", clock=clock)
    )
    first = EffectLedger(EffectLedgerOptions(store=store))
    second = EffectLedger(EffectLedgerOptions(store=store))
    try:
        yield clock, store, first, second
    finally:
        await store.close()


async def _ask(ledger: EffectLedger, call: ToolCall) -> Effect:
    """Run ``call`` so that it waits for a person; the effect as stored."""
    with pytest.raises(ApprovalPendingError):
        await ledger.run(call, lambda e: "ran", ASK)
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    return effect


async def _console(
    store: Store, effect: Effect, action: DecisionAction = DecisionAction.APPROVE
) -> bool:
    result = await decide(
        store,
        effect.idem_key,
        action=action,
        principal="ana",
        channel=Channel.CONSOLE,
        shown_intent=effect_intent(effect, None),
    )
    return result.accepted


async def test_a_scripted_scenario_is_counted_exactly(readings: Readings, workers: Workers) -> None:
    """Fresh run, replay, takeover after a lease, fenced commits (a begin() worker's
    and a run() whose handler outlived its lease), approve, refused decisions,
    deny, cancel, a park resolved by a person, and an expiry: every instrument's
    every series, exactly."""
    clock, store, ledger, other = workers

    # A fresh run, then its replay.
    pay = ToolCall(workflow_id="w", tool="pay", args={"n": 1})
    assert await ledger.run(pay, lambda e: "paid") == "paid"
    assert await other.run(pay, lambda e: "twice") == "paid"

    # A begin() worker goes silent; the next caller takes over after the lease;
    # the silent worker's late commit is fenced off.
    ship = ToolCall(workflow_id="w", tool="ship")
    begun = await ledger.begin(ship, run_options=LEASE)
    clock.advance(ms=61_000)
    assert await other.run(ship, lambda e: "shipped", LEASE) == "shipped"
    late = CommitSucceeded(result="late")
    assert not await ledger.commit(begun.effect.id, late, attempt=begun.effect.attempt)

    # A run() whose handler outlives its lease: taken over meanwhile, its commit
    # is refused and the winner's outcome is its answer.
    mail = ToolCall(workflow_id="w", tool="mail")

    async def outlives_its_lease(effect: Effect) -> str:
        clock.advance(ms=61_000)
        assert await other.run(mail, lambda e: "sent by the other", LEASE) == "sent by the other"
        return "sent late"

    assert await ledger.run(mail, outlives_its_lease, LEASE) == "sent by the other"

    # Approved from the console after 90 s, then run; a second click is refused.
    refund = ToolCall(workflow_id="w", tool="refund", args={"amount": 5})
    waiting = await _ask(ledger, refund)
    clock.advance(ms=90_000)
    assert await _console(store, waiting)
    assert not await _console(store, waiting)
    assert await ledger.run(refund, lambda e: "refunded", ASK) == "refunded"

    # A decision on what the person was not shown is refused.
    wire = ToolCall(workflow_id="w", tool="wire", args={"to": "x"})
    wired = await _ask(ledger, wire)
    refused = await decide(
        store,
        wired.idem_key,
        action=DecisionAction.APPROVE,
        principal="ana",
        channel=Channel.LINK,
        shown_intent="0" * 64,
    )
    assert refused.reason == "intent_mismatch"

    # Past its deadline: a decision is refused and the effect denied as expired.
    await approval_store(store).renew_request(
        wired.idem_key, requested_by="agent", policy_version=None, deadline_ms=60_000
    )
    clock.advance(ms=120_000)
    expired = await decide(
        store,
        wired.idem_key,
        action=DecisionAction.APPROVE,
        principal="ana",
        channel=Channel.LINK,
        shown_intent=effect_intent(wired, None),
        now=clock(),
    )
    assert expired.reason == "expired"

    # Denied in code after 30 s; canceled after 10 s.
    email = await _ask(ledger, ToolCall(workflow_id="w", tool="email"))
    clock.advance(ms=30_000)
    assert await ledger.deny(email.idem_key, "no", by="bo")
    sms = await _ask(ledger, ToolCall(workflow_id="w", tool="sms"))
    clock.advance(ms=10_000)
    assert await ledger.cancel(sms.idem_key, reason="not needed", by="bo")

    # A run under on_stale="park" goes silent after its handler started: the next
    # caller parks it for a person (no takeover), who resolves it 45 s later.
    charge = ToolCall(workflow_id="w", tool="charge")
    park = RunOptions(on_stale="park", stale=StaleOptions(after_ms=60_000), wait_for_approval=False)
    await ledger.begin(charge, run_options=park)
    clock.advance(ms=61_000)
    with pytest.raises(ApprovalPendingError):
        await other.run(charge, lambda e: "charged twice", park)
    clock.advance(ms=45_000)
    assert await ledger.resolve(ledger.idem_key(charge), result={"charged": True}, by="ops")

    assert readings.values("agent_ledger.executions") == {
        series(tool="pay"): 1,
        series(tool="ship"): 2,  # the begin() and the takeover's run
        series(tool="mail"): 2,  # both handlers ran
        series(tool="refund"): 1,
        series(tool="charge"): 1,  # the begin(); the park runs nothing
    }
    assert readings.values("agent_ledger.replays") == {series(tool="pay"): 1}
    assert readings.values("agent_ledger.takeovers") == {
        series(tool="ship"): 1,
        series(tool="mail"): 1,
    }
    assert readings.values("agent_ledger.fenced_commits") == {
        series(tool="ship"): 1,
        series(tool="mail"): 1,
    }
    assert readings.values("agent_ledger.decisions") == {
        series(tool="refund", channel="console", action="approve"): 1,
        series(tool="email", channel="code", action="deny"): 1,
        series(tool="charge", channel="code", action="resolve"): 1,
    }
    assert readings.values("agent_ledger.refused_decisions") == {
        series(channel="console", action="approve", reason="already_decided"): 1,
        series(channel="link", action="approve", reason="intent_mismatch"): 1,
        series(channel="link", action="approve", reason="expired"): 1,
    }
    assert readings.values("agent_ledger.approval.wait.duration") == {
        series(tool="refund", outcome="approved"): Histogram(1, 90.0),
        series(tool="wire", outcome="expired"): Histogram(1, 120.0),
        series(tool="email", outcome="denied"): Histogram(1, 30.0),
        series(tool="sms", outcome="canceled"): Histogram(1, 10.0),
        series(tool="charge", outcome="resolved"): Histogram(1, 45.0),
    }
    # Every effect sent to a person left: each series is back at 0.
    pending = readings.collect()["agent_ledger.approval.pending"]
    assert set(pending) == {series(tool=t) for t in ("refund", "wire", "email", "sms", "charge")}
    assert set(pending.values()) == {0}
    # The units, as the table documents them.
    assert {i.name: readings.unit(i.name) for i in metrics.INSTRUMENTS} == {
        i.name: i.unit for i in metrics.INSTRUMENTS
    }


async def test_concurrent_decisions_count_one_decision_and_the_rest_refused(
    readings: Readings, workers: Workers
) -> None:
    """20 concurrent approvals of one effect: one decision, 19 refusals, the pending
    count down once, one wait recorded."""
    clock, store, ledger, _ = workers
    effect = await _ask(ledger, ToolCall(workflow_id="w", tool="pay"))
    clock.advance(ms=5_000)
    accepted = await asyncio.gather(*(_console(store, effect) for _ in range(20)))
    assert sorted(accepted) == [False] * 19 + [True]
    assert readings.values("agent_ledger.decisions") == {
        series(tool="pay", channel="console", action="approve"): 1
    }
    assert readings.values("agent_ledger.refused_decisions") == {
        series(channel="console", action="approve", reason="already_decided"): 19
    }
    assert readings.collect()["agent_ledger.approval.pending"] == {series(tool="pay"): 0}
    assert readings.values("agent_ledger.approval.wait.duration") == {
        series(tool="pay", outcome="approved"): Histogram(1, 5.0)
    }


async def _waiting_in_store(store: Store) -> int:
    found = await store.list_effects(EffectQuery(status=EffectStatus.REQUIRES_APPROVAL))
    return len(found)


async def test_pending_approvals_follow_the_store_on_every_path_in_and_out(
    readings: Readings, workers: Workers
) -> None:
    """Into requires_approval by policy, by the holder's request, by asking again
    after an approval, by a waiter's park and by the park sweep; out by approve,
    deny, resolve, cancel, a saga's withdrawal and expiry: after each step the
    up-down counter's sum is the number of effects the store has waiting."""
    clock, store, ledger, other = workers

    async def check() -> None:
        pending = readings.collect().get("agent_ledger.approval.pending", {})
        assert sum(pending.values()) == await _waiting_in_store(store)

    a = await _ask(ledger, ToolCall(workflow_id="w", tool="a"))  # policy
    await check()
    held = await ledger.begin(ToolCall(workflow_id="w", tool="b"))
    assert await ledger.request_approval(held.effect.idem_key)  # the holder's own
    await check()
    assert await ledger.approve(a.idem_key, by="ana")
    await check()
    assert await ledger.request_approval(a.idem_key)  # asked again, from ready
    await check()
    park = RunOptions(on_stale="park", stale=StaleOptions(after_ms=60_000), wait_for_approval=False)
    c = ToolCall(workflow_id="w", tool="c")
    d = ToolCall(workflow_id="w", tool="d")
    await ledger.begin(c, run_options=park)
    await ledger.begin(d, run_options=park)
    clock.advance(ms=61_000)
    with pytest.raises(ApprovalPendingError):
        await other.run(c, lambda e: None, park)  # a waiter parks it
    await check()
    assert [e.tool for e in await other.park_stale()] == ["d"]  # the sweep parks it
    await check()
    assert await _waiting_in_store(store) == 4

    assert await ledger.deny(a.idem_key, "no", by="ana")
    await check()
    assert await ledger.resolve(ledger.idem_key(c), error=EffectError("lost", "x"), by="ops")
    await check()
    assert await ledger.cancel(ledger.idem_key(d), reason="later", by="ops")
    await check()
    withdrawn = EffectError("rolled back", "canceled")
    assert await cancel_if_waiting(store, held.effect.idem_key, withdrawn, by="saga")
    await check()
    e = await _ask(ledger, ToolCall(workflow_id="w", tool="e"))
    await approval_store(store).renew_request(
        e.idem_key, requested_by=None, policy_version=None, deadline_ms=1
    )
    clock.advance(ms=1_000)
    assert [x.tool for x in await expire_overdue(store)] == ["e"]
    await check()
    # Nothing left, nothing counted twice: every series back at 0.
    assert await _waiting_in_store(store) == 0
    assert set(readings.collect()["agent_ledger.approval.pending"].values()) == {0}
    # A cancel of an effect that no longer waits counts nothing.
    assert not await ledger.cancel(a.idem_key, reason="again", by="ops")
    await check()


async def test_a_cancel_from_ready_does_not_count_an_approval_leaving(
    readings: Readings, workers: Workers
) -> None:
    """Approved, then canceled before anyone claimed it: it left requires_approval
    once (the approval), not twice."""
    _, store, ledger, _ = workers
    effect = await _ask(ledger, ToolCall(workflow_id="w", tool="pay"))
    assert await ledger.approve(effect.idem_key, by="ana")
    assert await ledger.cancel(effect.idem_key, reason="changed my mind", by="ana")
    assert readings.collect()["agent_ledger.approval.pending"] == {series(tool="pay"): 0}
    waits = readings.values("agent_ledger.approval.wait.duration")
    assert list(waits) == [series(tool="pay", outcome="approved")]
    assert await _waiting_in_store(store) == 0


_PROCESS = textwrap.dedent(
    """
    import asyncio, sys, orjson
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from agent_ledger import ApprovalPendingError, EffectLedger, EffectLedgerOptions
    from agent_ledger import RunOptions, SqliteStore, ToolCall, metrics
    from agent_ledger.status import EffectStatus
    from agent_ledger.stores.base import EffectQuery, Store

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    async def main(path, role):
        store = SqliteStore(path)
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        ask = RunOptions(requires_approval=True, wait_for_approval=False)
        calls = [ToolCall(workflow_id="w", tool="pay", args={"n": n}) for n in range(3)]
        for call in calls:
            if role == "agent":
                try:
                    await ledger.run(call, lambda e: 1, ask)
                except ApprovalPendingError:
                    pass
            else:
                assert await ledger.approve(ledger.idem_key(call), by="ana")
        query = EffectQuery(status=EffectStatus.REQUIRES_APPROVAL)
        waiting = len(await store.list_effects(query))
        await store.close()
        points = [
            p.value
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics if m.name == "agent_ledger.approval.pending"
            for p in m.data.data_points
        ]
        print(orjson.dumps({"pending": sum(points), "waiting": waiting}).decode())

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def test_each_process_counts_the_transitions_it_made(tmp_path: Path) -> None:
    """An agent process asks for three approvals, a reviewer process decides them: the
    agent's pending count is +3, the reviewer's -3, and their sum is what the store
    has waiting at each moment (3, then 0). Nothing is counted by both."""

    def run(role: str) -> dict[str, int]:
        done = subprocess.run(
            [sys.executable, "-c", _PROCESS, str(tmp_path / "ledger.db"), role],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        out: dict[str, int] = orjson.loads(done.stdout)
        return out

    agent = run("agent")
    assert agent == {"pending": 3, "waiting": 3}
    reviewer = run("reviewer")
    assert reviewer == {"pending": -3, "waiting": 0}
    assert agent["pending"] + reviewer["pending"] == reviewer["waiting"]


def test_counts_from_many_threads_add_up(readings: Readings) -> None:
    """Sync callers run ledgers' loops on threads of their own: counts made on eight
    threads at once, switching as often as the interpreter allows, all land."""

    def count() -> None:
        for _ in range(5_000):
            metrics.executed("t")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=count) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert readings.values("agent_ledger.executions") == {series(tool="t"): 40_000}


def test_a_provider_given_again_goes_on_with_its_own_instruments(readings: Readings) -> None:
    """Recording on another provider, then on the first again: the first's counts go
    on from where they were, each series reported once; the other saw only its own."""
    other = Readings(reader := InMemoryMetricReader(), MeterProvider(metric_readers=[reader]))
    metrics.executed("t")
    metrics.set_meter_provider(other.provider)
    metrics.executed("t")
    metrics.set_meter_provider(readings.provider)
    metrics.executed("t")
    assert readings.values("agent_ledger.executions") == {series(tool="t"): 2}
    assert other.values("agent_ledger.executions") == {series(tool="t"): 1}
    other.provider.shutdown()
