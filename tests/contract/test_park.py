"""on_stale="park": an ambiguous attempt waits for a person, who settles it (every store).

A worker that dies after its handler started (its side effect may have
happened) is simulated by a ``begin()`` under ``on_stale="park"`` that never
commits: ``begin()`` records the handler's start exactly as ``run()`` does
just before calling the handler. One that dies *before* its handler started
is a bare ``Store.begin`` (inserted processing, nothing recorded). The
cross-process versions, with SIGKILL, are in tests/reliability/test_park_crashes.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from agent_ledger import (
    Effect,
    EffectDeniedError,
    EffectError,
    EffectFailedError,
    EffectLedgerValidationError,
    EffectStatus,
    JSONValue,
    LedgerHooks,
    RetryPolicy,
    RunOptions,
    ToolCall,
)
from agent_ledger.decisions import ambiguous_error
from agent_ledger.effects import CommitSucceeded, Parked, Settlement
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.status import AMBIGUOUS_ATTEMPT
from agent_ledger.stores.base import Held, NewEffect
from tests.approvals import PARK, make_parked, make_pending
from tests.harness import StoreHarness

S = EffectStatus
CHARGE = ToolCall(workflow_id="order-7", tool="payments.charge", args={"cents": 500})
#: A caller that takes over (or parks) after 1 s of silence.
TAKE_OVER = RunOptions(stale=StaleOptions(after_ms=1_000))


class Provider:
    """A fake payment provider: counts the charges it saw."""

    def __init__(self) -> None:
        self.charges = 0

    async def charge(self, effect: Effect) -> dict[str, object]:
        self.charges += 1
        return {"charge_id": f"ch_{self.charges}", "cents": effect.args["cents"]}


async def dead_after_handler_started(harness: StoreHarness, call: ToolCall = CHARGE) -> Effect:
    """A park run's worker that died mid-handler, its lease long out."""
    ledger = harness.ledger()
    begun = await ledger.begin(call, run_options=PARK)
    assert begun.effect.park_attempt == begun.effect.attempt == 1
    assert begun.effect.worker  # host:pid of this process
    await harness.age(60_000)
    return begun.effect


async def wait_until(harness: StoreHarness, key: str, status: S) -> Effect:
    for _ in range(500):
        found = await harness.store.find(key)
        if found is not None and found.status is status:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"{key[:12]} never reached {status.value}")


# -- parking -------------------------------------------------------------------------


@pytest.mark.parametrize("caller", [TAKE_OVER, PARK], ids=["take_over-caller", "park-caller"])
async def test_a_dead_park_holder_is_parked_never_run_again(
    harness: StoreHarness, caller: RunOptions
) -> None:
    """The holder's policy decides, whatever the caller's: the next caller parks the
    effect and waits; resolve() hands it (and every later caller) the provider's result."""
    dead = await dead_after_handler_started(harness)
    provider = Provider()
    ledger = harness.ledger()
    waiting = asyncio.create_task(ledger.run(CHARGE, provider.charge, caller))
    parked = await wait_until(harness, dead.idem_key, S.REQUIRES_APPROVAL)
    assert parked.parked and parked.error is not None
    assert parked.error.code == AMBIGUOUS_ATTEMPT
    assert parked.attempt == 1 and parked.executions == 1
    (event,) = parked.history
    assert isinstance(event, Parked) and event.attempt == 1 and event.worker == dead.worker
    assert event.started_at == dead.started_at
    assert not waiting.done()
    receipt: dict[str, JSONValue] = {"charge_id": "ch_real", "cents": 500}
    assert await ledger.resolve(
        dead.idem_key,
        result=receipt,
        by="ops@acme",
        note="provider shows ch_real",
        expected_attempt=1,
    )
    assert await asyncio.wait_for(waiting, 5) == receipt
    assert await ledger.run(CHARGE, provider.charge, caller) == receipt  # a replay
    assert provider.charges == 0
    done = await ledger.find_by_idem_key(dead.idem_key)
    assert done is not None and done.status is S.SUCCEEDED and done.error is None
    assert done.executions == 1 and done.decided_by == "ops@acme"
    settled = done.history[-1]
    assert isinstance(settled, Settlement)
    assert (settled.status, settled.attempt, settled.by, settled.note) == (
        S.SUCCEEDED,
        1,
        "ops@acme",
        "provider shows ch_real",
    )
    assert settled.at == done.decided_at == done.completed_at


async def test_approve_runs_it_once_more(harness: StoreHarness) -> None:
    """ "I checked, it did not happen": approve() sends it back to run, exactly once."""
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    await make_parked_by_sweep(ledger, dead)
    provider = Provider()
    waiting = [
        asyncio.create_task(ledger.run(CHARGE, provider.charge, TAKE_OVER)) for _ in range(3)
    ]
    await asyncio.sleep(0.05)
    assert await ledger.approve(
        dead.idem_key, by="ops", note="no charge at the provider", expected_attempt=1
    )
    results = await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert provider.charges == 1 and all(r == results[0] for r in results)
    done = await ledger.find_by_idem_key(dead.idem_key)
    assert done is not None and done.status is S.SUCCEEDED
    assert done.executions == 2 and done.attempt == 2 and done.error is None
    assert [type(e) for e in done.history] == [Parked, Settlement]


async def test_deny_gives_callers_the_denial(harness: StoreHarness) -> None:
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    provider = Provider()
    waiting = asyncio.create_task(ledger.run(CHARGE, provider.charge, TAKE_OVER))
    await wait_until(harness, dead.idem_key, S.REQUIRES_APPROVAL)
    assert await ledger.deny(dead.idem_key, reason="charged twice before; refunding", by="ops")
    with pytest.raises(EffectDeniedError) as raised:
        await asyncio.wait_for(waiting, 5)
    assert raised.value.reason == "charged twice before; refunding"
    with pytest.raises(EffectDeniedError):
        await ledger.run(CHARGE, provider.charge)
    assert provider.charges == 0


async def test_resolve_with_an_error_records_failed(harness: StoreHarness) -> None:
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    await make_parked_by_sweep(ledger, dead)
    declined = EffectError("card declined at the provider", "card_declined")
    assert await ledger.resolve(dead.idem_key, error=declined, by="ops")
    with pytest.raises(EffectFailedError) as raised:
        await ledger.run(CHARGE, Provider().charge)
    assert raised.value.code == "card_declined"


@pytest.mark.parametrize("caller", [TAKE_OVER, PARK], ids=["take_over", "park"])
async def test_a_worker_dead_before_its_handler_started_is_taken_over(
    harness: StoreHarness, caller: RunOptions
) -> None:
    """No handler start recorded: nothing can have happened, so it is run, once."""
    ledger = harness.ledger()
    new = NewEffect(
        ledger.idem_key(CHARGE), "order-7", None, "payments.charge", '{"cents":500}', None,
        lease_ms=1_000,
    )  # fmt: skip
    assert (await harness.store.begin(new)).created
    await harness.age(60_000)
    provider = Provider()
    assert await ledger.run(CHARGE, provider.charge, caller) == {"charge_id": "ch_1", "cents": 500}
    assert provider.charges == 1
    done = await ledger.find_by_idem_key(new.idem_key)
    assert done is not None and done.status is S.SUCCEEDED and done.attempt == 2
    assert not any(isinstance(e, Parked) for e in done.history)


async def test_a_live_park_holder_is_never_parked(harness: StoreHarness) -> None:
    """A holder that heartbeats keeps its effect: a caller waits for its outcome."""
    ledger = harness.ledger()
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(effect: Effect) -> str:
        started.set()
        await release.wait()
        return "done"

    holder = asyncio.create_task(ledger.run(CHARGE, slow, PARK))
    await started.wait()
    waiter = asyncio.create_task(ledger.run(CHARGE, slow, TAKE_OVER))
    await asyncio.sleep(0.1)
    found = await ledger.find_by_idem_key(ledger.idem_key(CHARGE))
    assert found is not None and found.status is S.PROCESSING and found.park_attempt == 1
    assert (
        await harness.store.park(found.idem_key, stale_after_ms=1_000, error=ambiguous_error())
    ).claimed is False
    release.set()
    assert await asyncio.wait_for(holder, 5) == "done"
    assert await asyncio.wait_for(waiter, 5) == "done"


async def test_the_sweep_parks_only_ambiguous_attempts(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    ambiguous = await dead_after_handler_started(harness)
    # A take_over run that died: the sweep leaves it for a takeover.
    other = ToolCall(workflow_id="order-7", tool="mail.send", args={"to": "ada"})
    plain = await ledger.begin(other, run_options=TAKE_OVER)
    await harness.age(60_000)
    parked = await ledger.park_stale()
    assert [e.idem_key for e in parked] == [ambiguous.idem_key]
    assert await ledger.park_stale() == []  # nothing left to park
    untouched = await ledger.find_by_idem_key(plain.effect.idem_key)
    assert untouched is not None and untouched.status is S.PROCESSING


async def test_the_hook_pages_someone_once_when_a_waiter_parks_it(harness: StoreHarness) -> None:
    paged: list[Effect] = []
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    hooks = LedgerHooks(on_approval_required=paged.append)
    no_wait = RunOptions(stale=StaleOptions(after_ms=1_000), wait_for_approval=False)
    from agent_ledger import ApprovalPendingError

    with pytest.raises(ApprovalPendingError):
        await ledger.run(CHARGE, Provider().charge, no_wait, hooks=hooks)
    with pytest.raises(ApprovalPendingError):
        await ledger.run(CHARGE, Provider().charge, no_wait, hooks=hooks)
    assert [e.idem_key for e in paged] == [dead.idem_key] and paged[0].parked


async def test_the_hook_pages_someone_when_a_sweep_parks_it(harness: StoreHarness) -> None:
    """The sweep is for when no caller is around: it pages through the same hook."""
    from agent_ledger.testing import build_ledger

    paged: list[Effect] = []
    dead = await dead_after_handler_started(harness)
    ledger = build_ledger(harness.store, hooks=LedgerHooks(on_approval_required=paged.append))
    (parked,) = await ledger.park_stale()
    assert [e.idem_key for e in paged] == [dead.idem_key] == [parked.idem_key]
    assert paged[0].parked
    assert await ledger.park_stale() == [] and len(paged) == 1


# -- fencing and races --------------------------------------------------------------------


async def test_the_dead_workers_late_commit_and_heartbeat_are_refused(
    harness: StoreHarness,
) -> None:
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    await make_parked_by_sweep(ledger, dead)
    assert not await ledger.commit(dead.id, CommitSucceeded(result={"late": True}), attempt=1)
    assert not await ledger.commit(dead.id, CommitSucceeded(result={"late": True}))
    beat = await harness.store.heartbeat([Held(dead.id, 1)])
    assert not beat.refreshed and not beat.busy
    still = await ledger.find_by_idem_key(dead.idem_key)
    assert still is not None and still.parked and still.result is None


async def test_park_and_takeover_race_has_one_winner(harness: StoreHarness) -> None:
    """A stale attempt is either parked (its handler started under park) or taken
    over (it did not), never both; concurrent tries agree."""
    dead = await dead_after_handler_started(harness)
    store = harness.store
    outcomes = await asyncio.gather(
        *(store.claim(dead.idem_key, stale_after_ms=1_000) for _ in range(3)),
        *(
            store.park(dead.idem_key, stale_after_ms=1_000, error=ambiguous_error())
            for _ in range(3)
        ),
    )
    claims, parks = outcomes[:3], outcomes[3:]
    assert not any(o.claimed for o in claims) and sum(o.claimed for o in parks) == 1
    final = await store.find(dead.idem_key)
    assert final is not None and final.parked and final.attempt == 1
    # Unrecorded start: the takeover wins and the park never applies.
    other = ToolCall(workflow_id="order-7", tool="mail.send", args={"to": "ada"})
    ledger = harness.ledger()
    begun = await ledger.begin(other, run_options=TAKE_OVER)
    await harness.age(60_000)
    raced = await asyncio.gather(
        store.park(begun.effect.idem_key, stale_after_ms=1_000, error=ambiguous_error()),
        store.claim(begun.effect.idem_key, stale_after_ms=1_000),
    )
    assert [o.claimed for o in raced] == [False, True]


async def test_recording_the_start_and_a_takeover_have_one_winner(harness: StoreHarness) -> None:
    """A slow holder recording its handler's start races a takeover of its stale
    claim: either it records (and the claim is refused) or the claim wins (and
    the holder must not run the handler)."""
    ledger = harness.ledger()
    begun = await ledger.begin(CHARGE, run_options=TAKE_OVER)
    await harness.age(60_000)
    marked, claim = await asyncio.gather(
        harness.store.mark_started(begun.effect.id, attempt=1, worker="slow"),
        harness.store.claim(begun.effect.idem_key, stale_after_ms=1_000),
    )
    assert marked != claim.claimed


async def test_two_operators_with_the_same_expected_attempt_one_wins(harness: StoreHarness) -> None:
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    await make_parked_by_sweep(ledger, dead)
    won = await asyncio.gather(
        ledger.resolve(dead.idem_key, result={"charge_id": "ch_a"}, by="ana", expected_attempt=1),
        ledger.approve(dead.idem_key, by="bo", expected_attempt=1),
        ledger.deny(dead.idem_key, by="cy", reason="no", expected_attempt=1),
        ledger.resolve(dead.idem_key, result={"charge_id": "ch_d"}, by="di", expected_attempt=1),
    )
    assert sum(won) == 1
    final = await ledger.find_by_idem_key(dead.idem_key)
    assert final is not None
    assert sum(isinstance(e, Settlement) for e in final.history) == 1


async def test_a_settle_naming_an_old_attempt_is_refused(harness: StoreHarness) -> None:
    """Parked at attempt 2 (approved once, parked again): a screen showing attempt 1
    changes nothing."""
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    await make_parked_by_sweep(ledger, dead)
    assert await ledger.approve(dead.idem_key, by="ops", expected_attempt=1)
    again = await ledger.begin(CHARGE, run_options=PARK)  # claims attempt 2, records its start
    assert again.effect.attempt == 2 and again.effect.park_attempt == 2
    await harness.age(60_000)
    assert len(await ledger.park_stale()) == 1
    before = await ledger.find_by_idem_key(dead.idem_key)
    assert before is not None and before.attempt == 2
    for settle in (
        ledger.approve(dead.idem_key, by="stale", expected_attempt=1),
        ledger.deny(dead.idem_key, by="stale", expected_attempt=1),
        ledger.resolve(dead.idem_key, result=1, by="stale", expected_attempt=1),
    ):
        assert await settle is False
    assert await ledger.find_by_idem_key(dead.idem_key) == before
    assert await ledger.resolve(dead.idem_key, result={"ok": 1}, by="ops", expected_attempt=2)


async def test_cancelling_a_waiting_caller_leaves_the_parked_effect_alone(
    harness: StoreHarness,
) -> None:
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    first = asyncio.create_task(ledger.run(CHARGE, Provider().charge, TAKE_OVER))
    parked = await wait_until(harness, dead.idem_key, S.REQUIRES_APPROVAL)
    second = asyncio.create_task(ledger.run(CHARGE, Provider().charge, TAKE_OVER))
    await asyncio.sleep(0.05)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    after = await ledger.find_by_idem_key(dead.idem_key)
    # The second caller counted as a duplicate; nothing else changed.
    assert after is not None and replace(after, dedup_count=parked.dedup_count) == parked
    assert await ledger.resolve(dead.idem_key, result={"charge_id": "ch_1"}, by="ops")
    assert await asyncio.wait_for(second, 5) == {"charge_id": "ch_1"}


async def test_a_waiter_times_out_like_an_approval_and_the_effect_stays_parked(
    harness: StoreHarness,
) -> None:
    from agent_ledger.errors import EffectTimeoutError

    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    short = RunOptions(
        stale=StaleOptions(after_ms=1_000), concurrency=ConcurrencyOptions(approval_timeout_ms=50)
    )
    with pytest.raises(EffectTimeoutError) as raised:
        await ledger.run(CHARGE, Provider().charge, short)
    assert raised.value.status is S.REQUIRES_APPROVAL
    still = await ledger.find_by_idem_key(dead.idem_key)
    assert still is not None and still.parked


# -- bad input ------------------------------------------------------------------------------


async def test_resolve_checks_its_input_and_changes_nothing(harness: StoreHarness) -> None:
    dead = await dead_after_handler_started(harness)
    ledger = harness.ledger()
    await make_parked_by_sweep(ledger, dead)
    before = await ledger.find_by_idem_key(dead.idem_key)
    bad = [
        ({"result": {"x": float("nan")}, "by": "ops"}, "result"),
        ({"result": {1, 2}, "by": "ops"}, "result"),
        ({"by": "ops"}, "result"),  # neither
        ({"result": 1, "error": EffectError("x"), "by": "ops"}, "result"),  # both
        ({"error": "declined", "by": "ops"}, "error"),
        ({"result": 1, "by": ""}, "by"),
        ({"result": 1, "by": "ops", "expected_attempt": 0}, "expected_attempt"),
        ({"result": 1, "by": "ops", "expected_attempt": True}, "expected_attempt"),
    ]
    for kwargs, field in bad:
        with pytest.raises(EffectLedgerValidationError) as raised:
            await ledger.resolve(dead.idem_key, **kwargs)  # type: ignore[arg-type]
        assert raised.value.field == field, kwargs
    with pytest.raises(EffectLedgerValidationError):
        await ledger.approve(dead.idem_key, expected_attempt=-1)
    assert await ledger.find_by_idem_key(dead.idem_key) == before


async def test_resolve_refuses_an_ordinary_approval(harness: StoreHarness) -> None:
    """Its handler never ran: there is no outcome to resolve, only a decision to make."""
    ledger = harness.ledger()
    pending = await make_pending(ledger, CHARGE)
    with pytest.raises(EffectLedgerValidationError, match="approve"):
        await ledger.resolve(pending.idem_key, result=1, by="ops")
    assert await ledger.find_by_idem_key(pending.idem_key) == pending
    assert await ledger.resolve("0" * 64, result=1, by="ops") is False


async def test_bad_on_stale_is_refused() -> None:
    with pytest.raises(EffectLedgerValidationError) as raised:
        RunOptions(on_stale="retry")  # type: ignore[arg-type]
    assert raised.value.field == "on_stale"


async def make_parked_by_sweep(ledger: object, dead: Effect) -> Effect:
    from agent_ledger import EffectLedger

    assert isinstance(ledger, EffectLedger)
    parked = [e for e in await ledger.park_stale() if e.idem_key == dead.idem_key]
    assert len(parked) == 1
    return parked[0]


__all__ = ["make_parked"]


async def test_approving_a_parked_effect_whose_tries_were_used_up_runs_it_once_more(
    harness: StoreHarness,
) -> None:
    """Both tries of a retry policy failed and were recorded, then the worker died
    before recording the final failure: parked. "It did not happen, run it again"
    must run the handler (a fresh set of tries, as reopen gives), not fail at once
    for tries the dead attempt used up."""
    ledger = harness.ledger()
    policy = RunOptions(
        on_stale="park",
        stale=StaleOptions(after_ms=1_000),
        retry=RetryPolicy(on=Exception, attempts=2, initial_ms=1, jitter=0),
    )
    begun = await ledger.begin(CHARGE, run_options=policy)
    for _ in range(2):
        assert await harness.store.record_try(
            begun.effect.id,
            attempt=begun.effect.attempt,
            error=EffectError("gateway timeout", "timeout"),
            error_type="TimeoutError",
        )
    await harness.age(60_000)
    (parked,) = await ledger.park_stale()
    assert parked.tries == 2
    assert await ledger.approve(parked.idem_key, by="ops", expected_attempt=parked.attempt)
    provider = Provider()
    result = await ledger.run(CHARGE, provider.charge, policy)
    assert result == {"charge_id": "ch_1", "cents": 500} and provider.charges == 1
