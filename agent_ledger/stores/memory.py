"""An in-process store: for tests, prototypes and single-process tools.

It keeps every effect until the process exits: no eviction, no TTL, no size
cap, so memory grows with the number of distinct calls. Every step is a
plain synchronous dict update inside one event loop, which makes each one
atomic without a lock; only transactions (which span awaits) need one.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Final, NoReturn

import orjson

from agent_ledger.clock import Clock, utc_now
from agent_ledger.codes import ErrorCode
from agent_ledger.effects import (
    Effect,
    EffectError,
    HistoryEvent,
    Parked,
    Reopening,
    RetryableFailure,
    Settlement,
    TryFailure,
    Usage,
    effect_from_fields,
    handler_time,
    history_from_json,
    storable_text,
    usage_from_json,
)
from agent_ledger.errors import RemovedNameError
from agent_ledger.fields import EFFECT_FIELDS
from agent_ledger.ids import new_effect_id
from agent_ledger.legacy.names import STORE_METHODS
from agent_ledger.status import (
    CLAIMABLE,
    COMPLETIONS,
    REOPENABLE,
    EffectStatus,
)
from agent_ledger.stores._legacy import LegacyStoreMethods, all_effects
from agent_ledger.stores._memory_approvals import MemoryApprovals
from agent_ledger.stores._memory_budgets import MemoryBudgets
from agent_ledger.stores._memory_sagas import MemorySagas
from agent_ledger.stores._rows import stats_from_groups
from agent_ledger.stores._subscriptions import Registration, Subscribers
from agent_ledger.stores._transactions import (
    LEASE_PAUSE_AFTER_MS,
    TransactionGate,
    TransactionHandle,
)
from agent_ledger.stores.base import (
    BeginOutcome,
    ClaimOutcome,
    Decision,
    EffectQuery,
    HeartbeatOutcome,
    Held,
    LedgerStats,
    NewEffect,
    SchemaMigration,
    check_commit_status,
    check_purge_statuses,
    check_settle_target,
    check_transition_target,
    transition_sources,
)

__all__ = ["MEMORY_SCHEMA_VERSION", "MemoryStore", "MemoryTransaction"]

#: What ``MemoryStore.check_schema`` reports: the version of the SQL schemas
#: whose behaviour it mirrors. It has nothing to create or migrate.
MEMORY_SCHEMA_VERSION: Final = 4

_PROCESSING = EffectStatus.PROCESSING
_REQUIRES_APPROVAL = EffectStatus.REQUIRES_APPROVAL
_READY = EffectStatus.READY
_FAILED = EffectStatus.FAILED


# MemoryStore keeps every field of the effect under its own name, except the
# result, kept as JSON text like in a database (see _columns).
_RESULT_AT: Final = EFFECT_FIELDS.index("result")
_ROW_SLOTS: Final = (*EFFECT_FIELDS[:_RESULT_AT], "result_json", *EFFECT_FIELDS[_RESULT_AT + 1 :])


class _Row:
    """The stored form of an effect: its fields by name, the result as JSON text."""

    __slots__ = _ROW_SLOTS

    def __init__(self, new: NewEffect, now: datetime) -> None:
        self.id = new_effect_id()
        (self.idem_key, self.workflow_id, self.call_id, self.tool, self.args_canonical,
         self.resource_id_canonical, _, self.lease_ms, history) = new  # fmt: skip
        self.status = _REQUIRES_APPROVAL if new.requires_approval else _PROCESSING
        # Inserted as processing, it is handed to its creator's handler.
        self.executions = 0 if new.requires_approval else 1
        self.started_at: datetime | None = None if new.requires_approval else now
        self.result_json: str | None = None
        self.error: EffectError | None = None
        self.dedup_count = 0
        self.attempt = 1
        self.created_at = self.updated_at = self.heartbeat_at = now
        self.completed_at: datetime | None = None
        self.decided_by: str | None = None
        self.decision_note: str | None = None
        self.decided_at: datetime | None = None
        self.tries = 0
        self.history: tuple[HistoryEvent, ...] = history_from_json(history) if history else ()
        self.usage: Usage | None = None
        self.park_attempt: int | None = None
        self.worker: str | None = None

    def snapshot(self) -> Effect:
        # Decoding on every read hands each caller its own result object, as
        # a database would: nobody can mutate another caller's receipt.
        # Field by field, by name: the slots are Effect's fields (a test holds them equal).
        result = None if self.result_json is None else orjson.loads(self.result_json)
        return effect_from_fields(self, result)


def _matches(row: _Row, query: EffectQuery, now: datetime) -> bool:
    return (
        (query.workflow_id is None or row.workflow_id == query.workflow_id)
        and (query.tool is None or row.tool == query.tool)
        and (query.status is None or row.status is query.status)
        and (query.since is None or row.created_at >= query.since)
        and (query.until is None or row.created_at < query.until)
        and (query.before is None or (row.created_at, row.id) < query.before)
        and (query.idem_key_prefix is None or row.idem_key.startswith(query.idem_key_prefix))
        and (query.call_id is None or row.call_id == query.call_id)
        and (
            query.error_code is None
            or (row.error is not None and row.error.code == query.error_code)
        )
        and _lasted(row, query, now)
    )


def _lasted(row: _Row, query: EffectQuery, now: datetime) -> bool:
    """The duration filters, by ``effects.handler_time`` (the SQL stores' CASE)."""
    if query.min_duration is None and query.max_duration is None:
        return True
    took = handler_time(row.snapshot(), now)
    return (
        took is not None
        and (query.min_duration is None or took >= query.min_duration)
        and (query.max_duration is None or took <= query.max_duration)
    )


class MemoryTransaction(TransactionHandle):
    """Handle from ``MemoryStore.transaction()``, to pass as ``tx``.

    Keeps an undo log, so the store can restore every row the block touched
    if it raises, and (through the gate) holds back notifications until the
    block commits.
    """

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self._undo: list[tuple[str, _Row | None]] = []

    def remember(self, idem_key: str, row: _Row | None) -> None:
        """Note ``row`` as it was (None: absent) before this transaction changes it."""
        self._undo.append((idem_key, copy.copy(row) if row is not None else None))

    def undo_log(self) -> list[tuple[str, _Row | None]]:
        """Every row as it was before each change, newest change last."""
        return self._undo


class MemoryStore(LegacyStoreMethods, MemorySagas, MemoryBudgets, MemoryApprovals):
    """Effects in a dict, with the same observable behaviour as the SQL stores.

    ``clock`` is the store's clock (inject a ``ManualClock`` to test
    takeover without sleeping). Transactions are serialized: while one is
    open, other operations wait for it to end, just as a database makes a
    second writer wait on the rows a transaction holds.
    """

    def __init__(self, *, clock: Clock = utc_now) -> None:
        # The system clock without utc_now's frame in between (same value):
        # a fresh call reads it twice.
        self._clock: Clock = functools.partial(datetime.now, UTC) if clock is utc_now else clock
        self._rows: dict[str, _Row] = {}
        self._ids: dict[str, str] = {}  # effect id -> idem key
        self._legacy: dict[str, str] = {}  # 0.2.x key -> idem key (import-0.2)
        self._subscribers = Subscribers()
        self._gate = TransactionGate(self, MemoryTransaction, "MemoryStore", self._subscribers)
        self._init_sagas()
        self._init_budgets()
        self._init_approvals()

    # -- schema ------------------------------------------------------------

    async def create_schema(self) -> None:
        """Nothing to create: the dicts exist from the start."""

    async def migrate(self) -> SchemaMigration:
        """Nothing to migrate: always at ``MEMORY_SCHEMA_VERSION``."""
        return SchemaMigration(MEMORY_SCHEMA_VERSION, MEMORY_SCHEMA_VERSION)

    async def check_schema(self) -> int:
        """Always in place: ``MEMORY_SCHEMA_VERSION``."""
        return MEMORY_SCHEMA_VERSION

    # -- transactions ----------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryTransaction]:
        # A second transaction() inside a block would wait for the first one
        # to end: refused, as SqliteStore refuses it.
        self._gate.refuse_inside()
        async with self._gate.lock:
            tx = MemoryTransaction(self)
            self._gate.open(tx)
            opened = self._clock()
            try:
                yield tx
            except BaseException:
                # CancelledError too: a cancelled block must not half-apply.
                self._restore(tx.undo_log())
                raise
            finally:
                self._pause_leases(opened)
                self._gate.close(tx)
        self._gate.committed(tx)

    def _pause_leases(self, opened: datetime) -> None:
        """Nobody could heartbeat while the transaction held the store: move the
        heartbeat of every effect held since before it by its duration
        (``_transactions`` says why)."""
        held_for = self._clock() - opened
        if held_for < timedelta(milliseconds=LEASE_PAUSE_AFTER_MS):
            return
        for row in self._rows.values():
            if row.status is _PROCESSING and row.heartbeat_at < opened:
                row.heartbeat_at += held_for

    async def _enter(self, tx: object | None) -> MemoryTransaction | None:
        """Check ``tx`` and wait out another task's open transaction."""
        return await self._gate.enter(tx)

    def _restore(self, undo_log: list[tuple[str, _Row | None]]) -> None:
        """Put every row back as it was before a rolled-back transaction."""
        rows, ids = self._rows, self._ids
        for idem_key, before in reversed(undo_log):
            current = rows.pop(idem_key, None)
            if current is not None:
                ids.pop(current.id, None)
            if before is not None:
                rows[idem_key] = before
                ids[before.id] = idem_key

    # -- ledger steps ----------------------------------------------------

    async def begin(
        self, new: NewEffect, *, tx: object | None = None, lock_timeout_ms: int | None = None
    ) -> BeginOutcome:
        mtx = (
            None
            if tx is None and self._gate.active is None
            else await self._gate.enter(tx, lock_timeout_ms=lock_timeout_ms, idem_key=new.idem_key)
        )
        row = self._rows.get(new.idem_key)
        if row is None:
            if mtx is not None:
                mtx.remember(new.idem_key, row)
            row = _Row(new, self._clock())
            self._rows[new.idem_key] = row
            self._ids[row.id] = new.idem_key
            # A new row has no result yet: its snapshot without the decoding step.
            return BeginOutcome(effect_from_fields(row, None), True)  # created
        if tx is None:  # inside a transaction an existing effect is only read (Store.begin)
            row.dedup_count += 1
        return BeginOutcome(row.snapshot(), False)

    async def claim(
        self,
        idem_key: str,
        *,
        stale_after_ms: int,
        lease_ms: int | None = None,
        tx: object | None = None,
        lock_timeout_ms: int | None = None,
    ) -> ClaimOutcome:
        mtx = (
            None
            if tx is None and self._gate.active is None
            else await self._gate.enter(tx, lock_timeout_ms=lock_timeout_ms, idem_key=idem_key)
        )
        row = self._rows.get(idem_key)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        now = self._clock()
        # From processing itself only when the holder's heartbeat is older than
        # its lease (and the caller's window): a takeover. 0 on either side: never.
        claimable = row.status in CLAIMABLE and (
            row.status is not _PROCESSING
            or (
                stale_after_ms > 0
                and row.lease_ms > 0
                and now - row.heartbeat_at
                >= timedelta(milliseconds=max(row.lease_ms, stale_after_ms))
                # An attempt whose handler started under park is parked, never taken over.
                and row.park_attempt != row.attempt
            )
        )
        if not claimable:
            return ClaimOutcome(row.snapshot(), claimed=False)
        if mtx is not None:
            mtx.remember(idem_key, row)
        row.status = _PROCESSING
        row.attempt += 1
        row.executions += 1
        row.lease_ms = stale_after_ms if lease_ms is None else lease_ms
        row.heartbeat_at = row.started_at = row.updated_at = now
        self._gate.changed(row.idem_key, mtx)
        return ClaimOutcome(row.snapshot(), claimed=True)

    async def heartbeat(self, held: Sequence[Held]) -> HeartbeatOutcome:
        if self._gate.active is not None:
            await self._enter(None)
        now = self._clock()
        refreshed = []
        for one in held:
            row = self._row_by_id(one.effect_id)
            if row is not None and row.status is _PROCESSING and row.attempt == one.attempt:
                row.heartbeat_at = now
                refreshed.append(one)
        return HeartbeatOutcome(frozenset(refreshed))

    async def commit(
        self,
        effect_id: str,
        *,
        attempt: int | None,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None = None,
        ends_try: bool = True,
        usage_json: str | None = None,
        started: bool = True,
        retryable: bool = False,
    ) -> bool:
        if status not in COMPLETIONS:
            check_commit_status(status)  # raises
        mtx = None if tx is None and self._gate.active is None else await self._enter(tx)
        idem_key = self._ids.get(effect_id)  # _row_by_id, inline: once per fresh call
        row = self._rows.get(idem_key) if idem_key is not None else None
        if row is None or row.status is not _PROCESSING:
            return False
        if attempt is not None and row.attempt != attempt:
            return False
        if mtx is not None:
            mtx.remember(row.idem_key, row)
        now = self._clock()
        row.status = status
        row.result_json = result_json
        row.usage = None if usage_json is None else usage_from_json(usage_json)
        row.error = error
        row.tries += ends_try
        if not started:
            row.executions -= 1  # the claim's: its handler never started
        if retryable and status is EffectStatus.FAILED and error is not None:
            failure = RetryableFailure(row.attempt, error.message, error.code, now)
            row.history = (*row.history, failure)
        row.completed_at = row.updated_at = now
        self._gate.changed(row.idem_key, mtx)
        return True

    async def record_try(
        self, effect_id: str, *, attempt: int, error: EffectError, error_type: str
    ) -> bool:
        if self._gate.active is not None:
            await self._enter(None)
        row = self._row_by_id(effect_id)
        if row is None or row.status is not _PROCESSING or row.attempt != attempt:
            return False
        now = self._clock()
        row.tries += 1
        failure = TryFailure(row.tries, attempt, error.message, error.code, error_type, now)
        row.history = (*row.history, failure)
        row.heartbeat_at = now
        return True

    async def release(self, effect_id: str, *, attempt: int, for_approval: bool = False) -> bool:
        if self._gate.active is not None:
            await self._enter(None)
        row = self._row_by_id(effect_id)
        if row is None or row.status is not _PROCESSING or row.attempt != attempt:
            return False
        row.status = _REQUIRES_APPROVAL if for_approval else _READY
        # The handler never started: this claim ran nothing.
        row.executions -= 1
        if row.executions == 0:
            row.started_at = None
        row.updated_at = self._clock()
        self._gate.changed(row.idem_key, None)
        return True

    async def transition(
        self,
        idem_key: str,
        *,
        target: EffectStatus,
        error: EffectError | None = None,
        decision: Decision | None = None,
        tx: object | None = None,
        sources: frozenset[EffectStatus] | None = None,
    ) -> Effect | None:
        check_transition_target(target)
        allowed = transition_sources(target, sources)
        mtx = None if tx is None and self._gate.active is None else await self._enter(tx)
        row = self._rows.get(idem_key)
        if row is None or row.status not in allowed:
            return None
        if mtx is not None:
            mtx.remember(idem_key, row)
        now = self._clock()
        row.status = target
        row.updated_at = now
        if error is not None:
            row.error = error
        if decision is not None:
            row.decided_by, row.decision_note, row.decided_at = decision.by, decision.note, now
        if target.is_terminal:
            row.completed_at = now
        self._gate.changed(row.idem_key, mtx)
        return row.snapshot()

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> Effect | None:
        if self._gate.active is not None:
            await self._enter(None)
        row = self._rows.get(idem_key)
        if row is None or row.status not in REOPENABLE:
            return None
        now = self._clock()
        reopening = Reopening(row.status, row.error, row.tries, by, reason, now)
        row.history = (*row.history, reopening)
        row.status = _READY
        row.error = None
        row.tries = 0
        row.completed_at = None
        row.decided_by, row.decision_note, row.decided_at = by, reason, now
        row.updated_at = now
        self._gate.changed(idem_key, None)
        return row.snapshot()

    async def retry_failed(self, idem_key: str, *, attempt: int, lease_ms: int) -> ClaimOutcome:
        if self._gate.active is not None:
            await self._enter(None)
        row = self._rows.get(idem_key)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        if row.status is not _FAILED or row.attempt != attempt:
            return ClaimOutcome(row.snapshot(), claimed=False)
        now = self._clock()
        row.status = _PROCESSING
        row.attempt += 1
        row.executions += 1
        row.lease_ms = lease_ms
        row.result_json = None
        row.usage = None
        row.error = None
        row.tries = 0
        row.completed_at = None
        row.heartbeat_at = row.started_at = row.updated_at = now
        self._gate.changed(idem_key, None)
        return ClaimOutcome(row.snapshot(), claimed=True)

    async def mark_started(
        self, effect_id: str, *, attempt: int, worker: str, tx: object | None = None
    ) -> bool:
        mtx = None if tx is None and self._gate.active is None else await self._enter(tx)
        row = self._row_by_id(effect_id)
        if row is None or row.status is not _PROCESSING or row.attempt != attempt:
            return False
        if mtx is not None:
            mtx.remember(row.idem_key, row)
        row.park_attempt = attempt
        row.worker = storable_text(worker)
        row.heartbeat_at = self._clock()
        return True

    async def park(self, idem_key: str, *, stale_after_ms: int, error: EffectError) -> ClaimOutcome:
        if self._gate.active is not None:
            await self._enter(None)
        row = self._rows.get(idem_key)
        if row is None:
            return ClaimOutcome(None, claimed=False)
        now = self._clock()
        ambiguous = (
            row.status is _PROCESSING
            and row.park_attempt == row.attempt
            and stale_after_ms > 0
            and row.lease_ms > 0
            and now - row.heartbeat_at >= timedelta(milliseconds=max(row.lease_ms, stale_after_ms))
        )
        if not ambiguous:
            return ClaimOutcome(row.snapshot(), claimed=False)
        parked = Parked(row.attempt, row.started_at, row.worker, row.heartbeat_at, now)
        row.history = (*row.history, parked)
        row.status = _REQUIRES_APPROVAL
        row.error = error
        row.updated_at = now
        self._gate.changed(idem_key, None)
        return ClaimOutcome(row.snapshot(), claimed=True)

    async def settle(
        self,
        idem_key: str,
        *,
        target: EffectStatus,
        decision: Decision,
        expected_attempt: int | None = None,
        only_parked: bool = False,
        result_json: str | None = None,
        error: EffectError | None = None,
    ) -> Effect | None:
        check_settle_target(target)
        if self._gate.active is not None:
            await self._enter(None)
        row = self._rows.get(idem_key)
        if (
            row is None
            or row.status is not _REQUIRES_APPROVAL
            or (expected_attempt is not None and row.attempt != expected_attempt)
        ):
            return None
        parked = row.error is not None and row.error.code == ErrorCode.AMBIGUOUS_ATTEMPT
        if only_parked and not parked:
            return None
        now = self._clock()
        request = self._requests.get(idem_key)
        if (
            target is not EffectStatus.DENIED
            and request is not None
            and request.deadline_at is not None
            and request.deadline_at <= now
        ):
            return None  # past its deadline nobody approves (or resolves) it; a denial may
        if target is _READY and parked:
            row.tries = 0  # a fresh set of tries, as a reopen gives (see settle_params)
        settled = Settlement(target, row.attempt, decision.by, decision.note, now)
        row.history = (*row.history, settled)
        row.status = target
        row.result_json = result_json
        row.error = error
        row.decided_by, row.decision_note, row.decided_at = decision.by, decision.note, now
        if target.is_terminal:
            row.completed_at = now
        row.updated_at = now
        self._gate.changed(idem_key, None)
        return row.snapshot()

    async def get(self, effect_id: str, *, tx: object | None = None) -> Effect | None:
        if tx is not None or self._gate.active is not None:
            await self._enter(tx)
        row = self._row_by_id(effect_id)
        return row.snapshot() if row is not None else None

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        if tx is not None or self._gate.active is not None:
            await self._enter(tx)
        row = self._rows.get(idem_key)
        return row.snapshot() if row is not None else None

    async def find_legacy(self, legacy_key: str, *, tx: object | None = None) -> Effect | None:
        if tx is not None or self._gate.active is not None:
            await self._enter(tx)
        idem_key = self._legacy.get(legacy_key)
        row = self._rows.get(idem_key) if idem_key is not None else None
        return row.snapshot() if row is not None else None

    async def record_legacy(self, legacy_key: str, idem_key: str) -> bool:
        """Record that 0.2.x's ``legacy_key`` names the effect keyed ``idem_key``
        here, as ``agent-ledger import-0.2`` does for each row it brings over.

        True if recorded; False, changing nothing, if ``legacy_key`` already
        has a mapping (the first one stays, as in the SQL stores).
        """
        if self._gate.active is not None:
            await self._enter(None)
        if legacy_key in self._legacy:
            return False
        self._legacy[legacy_key] = idem_key
        return True

    # -- audit -------------------------------------------------------------

    async def list_effects(self, query: EffectQuery | None = None) -> list[Effect]:
        if query is None:
            return await all_effects(self)  # 0.2.x's bare call
        if self._gate.active is not None:
            await self._enter(None)
        now = self._clock()
        rows = [row for row in self._rows.values() if _matches(row, query, now)]
        rows.sort(key=lambda row: (row.created_at, row.id), reverse=True)
        return [row.snapshot() for row in rows[: query.limit]]

    async def stats(self) -> LedgerStats:
        if self._gate.active is not None:
            await self._enter(None)
        return stats_from_groups(
            (row.status, row.tool, 1, row.dedup_count) for row in self._rows.values()
        )

    async def purge(self, *, older_than: timedelta, statuses: frozenset[EffectStatus]) -> int:
        check_purge_statuses(statuses)
        if self._gate.active is not None:
            await self._enter(None)
        cutoff = self._clock() - older_than
        # A saga's step or undo stays (sagas are never purged), as on every store.
        kept = {
            key
            for steps in self._step_rows.values()
            for step in steps.values()
            for key in (step.idem_key, step.compensation_key)
        }
        doomed = [
            row
            for row in self._rows.values()
            if row.status in statuses
            and row.completed_at is not None
            and row.completed_at <= cutoff
            and row.idem_key not in kept
        ]
        for row in doomed:
            del self._rows[row.idem_key]
            del self._ids[row.id]
        return len(doomed)

    def _row_by_id(self, effect_id: str) -> _Row | None:
        # _ids holds only ids from new_effect_id, so text that is not an effect
        # id (ids.is_effect_id: canonical form only) finds nothing, as on every
        # store, without paying for the check on every step.
        idem_key = self._ids.get(effect_id)
        return self._rows.get(idem_key) if idem_key is not None else None

    # -- notifications ---------------------------------------------------

    def subscribe(self, idem_key: str) -> Registration:
        return self._subscribers.subscribe(idem_key)

    async def flush_counts(self) -> None:
        """Nothing waits: MemoryStore counts each duplicate at once, in the same step."""

    async def close(self) -> None:
        """Nothing to release; present to satisfy the Store protocol."""

    def __len__(self) -> int:
        """How many effects the store holds."""
        return len(self._rows)

    @property
    def size(self) -> int:
        """0.2.x's ``MemoryStore.size`` (deprecated): ``len(store)``."""
        warnings.warn(
            "MemoryStore.size is agent-ledger 0.2.x's; use len(store)",
            DeprecationWarning,
            stacklevel=2,
        )
        return len(self._rows)

    def clear(self) -> NoReturn:
        """0.2.x's ``MemoryStore.clear()``: gone (see the error)."""
        raise RemovedNameError("clear", STORE_METHODS["clear"], owner="MemoryStore")
