"""``ledger.recover_sagas()``: finish the sagas whose owners are gone.

A saga that was compensating when its owner died is finished from its stored
steps and the tool registry: nothing of the dead worker's memory is needed.
A saga that was still running forward cannot be continued here (the code
that chooses its next step is gone): re-running that code under the same id
continues it; otherwise it is rolled back once it has been left longer than
its ``abandon_after``, and until then (or for ever, by default) it is listed
for a person.

Claims are fenced compare-and-sets, so of two recoverers (or a recoverer and
a re-run of the code) one takes each saga; compensations are effects keyed
from their forward keys, so even a recoverer that takes a saga over from a
paused one runs each undo once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Final

from agent_ledger.codes import ErrorCode
from agent_ledger.context import not_waiting_for_parked
from agent_ledger.effects import EffectError
from agent_ledger.errors import EffectLedgerError, EffectTimeoutError
from agent_ledger.observability import logger
from agent_ledger.sagas._compensation import check_compensation_tool
from agent_ledger.sagas._outcome import SagaOutcome
from agent_ledger.sagas._saga import (
    finish_compensation,
    kept_alive,
    lease_of,
    owner_of,
    saga_store,
)
from agent_ledger.stores.saga_base import SagaRecord, SagaStatus, SagaStore, check_saga_limit

if TYPE_CHECKING:
    from agent_ledger.tools import ToolLedger

_G = SagaStatus
#: The code an abandoned saga is rolled back with (an alias of
#: ``ErrorCode.SAGA_ABANDONED``, kept for code that imports it from here).
ABANDONED_CODE: Final = ErrorCode.SAGA_ABANDONED


@dataclass(frozen=True, slots=True)
class SagaRecovery:
    """What one ``recover_sagas()`` pass did."""

    #: Sagas this pass finished compensating (abandoned ones included), as they ended.
    finished: list[SagaOutcome] = field(default_factory=list)
    #: The ids of running sagas rolled back because they were abandoned.
    abandoned: list[str] = field(default_factory=list)
    #: Up to ``limit`` running sagas (newest first) this pass left alone: a
    #: live owner, or one whose code must be re-run (no ``abandon_after``, or
    #: not abandoned long enough yet), for a person to look at.
    running: list[SagaRecord] = field(default_factory=list)
    #: Sagas this pass could not finish, with why (a compensation tool not
    #: registered in this process, say); another pass may.
    errors: list[tuple[str, str]] = field(default_factory=list)


async def recover_sagas(
    ledger: ToolLedger,
    *,
    owner: str | None = None,
    lease_ms: int | None = None,
    limit: int = 100,
) -> SagaRecovery:
    """One pass: finish up to ``limit`` sagas a claim can take now, oldest first;
    then list up to ``limit`` running sagas for a person. See the module doc."""
    store = saga_store(ledger)
    check_saga_limit(limit)
    lease = lease_of(lease_ms)
    me = owner_of(owner)
    report = SagaRecovery()
    # The store selects only sagas a claim can take (never the newest open
    # ones, filtered here: live or kept running sagas would hide a dead one
    # behind them). A saga this pass cannot finish (a tool missing) does not
    # count, and the pass pages on past it, so it always makes progress.
    after: tuple[datetime, str] | None = None
    taken = 0
    while taken < limit:
        page = await store.claimable_sagas(limit=limit, after=after)
        for saga in page:
            if taken >= limit:
                break
            after = (saga.created_at, saga.saga_id)
            if await _recover_one(ledger, store, saga, lease, me, report):
                taken += 1
        if len(page) < limit:
            break
    abandoned = set(report.abandoned)
    running = await store.list_sagas(statuses=frozenset({_G.RUNNING}), limit=limit)
    report.running.extend(s for s in running if s.saga_id not in abandoned)
    return report


async def _recover_one(
    ledger: ToolLedger,
    store: SagaStore,
    saga: SagaRecord,
    lease: int,
    me: str,
    report: SagaRecovery,
) -> bool:
    """Claim and finish ``saga``; True if this pass took it."""
    try:
        # A pass that lacks a compensation tool leaves the saga unclaimed,
        # so a pass that has it need not wait out this one's lease.
        await _check_tools(ledger, store, saga)
        if saga.status is _G.COMPENSATING:
            claimed = await store.claim_saga(
                saga.saga_id,
                expect=_G.COMPENSATING,
                then=_G.COMPENSATING,
                lease_ms=lease,
                idle_ms=0,
                owner=me,
            )
        else:
            claimed = await _abandon(store, saga, lease, me)
            if claimed is not None:
                report.abandoned.append(saga.saga_id)
        if claimed is None:
            return False  # taken by another recoverer, or its owner came back
        try:
            report.finished.append(await _finish(ledger, store, claimed))
        except EffectTimeoutError:
            # The wait for an undo another worker holds ran out: nothing was
            # decided, and the next pass must not wait out this one's lease
            # to try again (issue 26 follow-up, finding 4).
            await store.release_saga(saga.saga_id, attempt=claimed.attempt)
            raise
        return True
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        # One line for what a person can act on (a tool not registered, a
        # step that cannot be settled, a store error); a traceback only for
        # what would be a bug.
        expected = isinstance(exc, EffectLedgerError)
        logger.warning(
            "recover_sagas: saga %r not finished: %s", saga.saga_id, why, exc_info=not expected
        )
        report.errors.append((saga.saga_id, why))
        return False


async def _check_tools(ledger: ToolLedger, store: SagaStore, saga: SagaRecord) -> None:
    if saga.status is _G.RUNNING and saga.abandon_after_ms is None:
        return
    for step in await store.saga_steps(saga.saga_id):
        if step.compensation is not None:
            check_compensation_tool(ledger, step.tool, step.compensation)


async def _abandon(
    store: SagaStore, saga: SagaRecord, lease_ms: int, owner: str
) -> SagaRecord | None:
    """Take a running saga left longer than its ``abandon_after`` and start its undo."""
    if saga.abandon_after_ms is None:
        return None
    claimed = await store.claim_saga(
        saga.saga_id,
        expect=_G.RUNNING,
        then=_G.RUNNING,
        lease_ms=lease_ms,
        idle_ms=saga.abandon_after_ms,
        owner=owner,
    )
    if claimed is None:
        return None
    reason = EffectError(
        f"abandoned: its owner ({saga.owner or 'unnamed'}) was gone for longer than "
        f"abandon_after ({saga.abandon_after_ms} ms)",
        ErrorCode.SAGA_ABANDONED,
    )
    moved = await store.finish_saga(
        saga.saga_id, attempt=claimed.attempt, expect=_G.RUNNING, then=_G.COMPENSATING, error=reason
    )
    if not moved:
        return None
    return await store.get_saga(saga.saga_id)


async def _finish(ledger: ToolLedger, store: SagaStore, saga: SagaRecord) -> SagaOutcome:
    # A step parked for a person stops this saga's undo (reported in errors)
    # instead of holding up the pass until someone settles it.
    with not_waiting_for_parked(), kept_alive(ledger, store, saga):
        return await finish_compensation(ledger, store, saga)
