"""A recovery pass that ran out of wait releases the saga it claimed, so the
next pass can finish it at once (issue 26 follow-up, finding 4).

The dead owner had begun an undo whose lease (15 s) is longer than the
recoverer waits (200 ms). The pass claims the saga for its own lease (60 s
here; 15 s by default), waits for the undo, gives up: the saga stays
``compensating``. Before the fix it also stayed claimed for that lease, so
every pass within it skipped the saga, though the undo's lease had run out
long before (the adversary's a3 with the default lease). Now the pass gives
its claim back as it gives up, and the next pass, once the undo's lease has
run out, takes the undo over and finishes the saga, running the undo once.
"""

from __future__ import annotations

from agent_ledger import EffectStatus, RunOptions
from agent_ledger.options import ConcurrencyOptions
from agent_ledger.sagas import SagaStatus
from agent_ledger.sagas._compensation import compensation_call
from tests.harness import StoreHarness
from tests.sagas.conftest import shop_of
from tests.sagas.test_recovery import _dead_while_compensating, store_effect

G = SagaStatus
PASS_LEASE_MS = 60_000


async def test_a_pass_that_gave_up_waiting_lets_the_next_pass_finish_the_saga(
    harness: StoreHarness,
) -> None:
    shop, store = await _dead_while_compensating(harness)
    step = next(s for s in await store.saga_steps("order-42") if s.tool == "s2")
    forward = await store_effect(harness, step.idem_key)
    call = compensation_call(forward.workflow_id, "undo.s2", forward.idem_key)
    begun = await harness.ledger().begin(call)  # the default lease, 15 s
    impatient = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=200))
    recoverer = shop_of(harness.ledger(defaults=impatient), "s1", "s2", "s3")
    recoverer.log = shop.log
    first = await recoverer.ledger.recover_sagas(lease_ms=PASS_LEASE_MS)
    assert [saga_id for saga_id, _ in first.errors] == ["order-42"]
    saga = await store.get_saga("order-42")
    assert saga is not None and saga.status is G.COMPENSATING
    # The undo's lease has run out; the first pass's own lease has not.
    await harness.age(20_000)
    later = await recoverer.ledger.recover_sagas(lease_ms=PASS_LEASE_MS)
    assert [o.status for o in later.finished] == [G.COMPENSATED], later.errors
    assert shop.log == ["s1", "s2", "s3", "undo s2", "undo s1"]
    undone = await harness.store.find(begun.effect.idem_key)
    assert undone is not None and undone.status is EffectStatus.SUCCEEDED


async def test_a_release_is_fenced_by_the_attempt_and_the_status(harness: StoreHarness) -> None:
    _, store = await _dead_while_compensating(harness)
    saga = await store.get_saga("order-42")
    assert saga is not None
    # Not the holder's attempt: nothing changes.
    assert not await store.release_saga("order-42", attempt=saga.attempt + 1)
    assert await store.get_saga("order-42") == saga
    assert await store.release_saga("order-42", attempt=saga.attempt)
    released = await store.get_saga("order-42")
    assert released is not None and released.heartbeat_at < saga.heartbeat_at
    assert not await store.release_saga("unknown", attempt=1)
