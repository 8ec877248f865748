"""Test utilities: for applications that use agent-ledger, and for its own tests.

- :class:`ManualClock` moves only when told to, so staleness and takeover can be
  tested without sleeping (give it to ``MemoryStore(clock=...)`` or
  ``SqliteStore(..., clock=...)``).
- :class:`FaultyStore` wraps any store and fails chosen steps on demand, so a
  test can simulate an outage, a slow server or a lost reply without
  subclassing a store (and without depending on its private methods). It
  forwards the saga steps too (:data:`SAGA_STEPS`), so sagas run through it.
- :func:`build_ledger` builds an :class:`EffectLedger` in one call, because a
  test wants a store and maybe some defaults, not three nested option objects.
- :class:`StatementCounter` counts the statements a PostgreSQL client really
  sent, from libpq's own trace, so a round-trip budget is measured rather
  than assumed. psycopg is imported only when it is used: this module imports
  without the ``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

from agent_ledger.clock import ManualClock
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import EffectLedgerValidationError, EffectStoreError
from agent_ledger.ledger import EffectLedger
from agent_ledger.options import EffectLedgerOptions, LedgerDefaults, LedgerHooks, RunOptions
from agent_ledger.status import EffectStatus
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
    Store,
    Subscription,
)
from agent_ledger.stores.saga_base import (
    NewSaga,
    NewSagaStep,
    SagaBegin,
    SagaRecord,
    SagaStatus,
    SagaStep,
    SagaStore,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = [
    "SAGA_STEPS",
    "STORE_STEPS",
    "FaultyStore",
    "ManualClock",
    "StatementCounter",
    "build_ledger",
]

#: The store steps a :class:`FaultyStore` can fail or slow down: every ``Store``
#: method that reaches the backend. ``subscribe``, ``transaction`` and ``close``
#: are forwarded but not faultable: a failure inside a transaction shows up on
#: the steps run with its ``tx``.
STORE_STEPS: Final = (
    "begin",
    "claim",
    "heartbeat",
    "commit",
    "record_try",
    "release",
    "transition",
    "reopen",
    "retry_failed",
    "mark_started",
    "park",
    "settle",
    "get",
    "find",
    "find_legacy",
    "list_effects",
    "stats",
    "flush_counts",
    "purge",
    "create_schema",
    "migrate",
    "check_schema",
)
#: The saga steps (``SagaStore``) a :class:`FaultyStore` forwards, faultable like
#: the others, when the store it wraps keeps sagas (every store of this package).
SAGA_STEPS: Final = (
    "begin_saga",
    "claim_saga",
    "heartbeat_saga",
    "finish_saga",
    "record_step",
    "get_saga",
    "saga_steps",
    "list_sagas",
    "claimable_sagas",
)

StoreT = TypeVar("StoreT", bound=Store)
R = TypeVar("R")

#: ``"before"``: the step fails without reaching the store (an outage).
#: ``"after"``: the step is applied, then fails (a lost reply: the server
#: committed, the connection broke before the answer arrived).
When = Literal["before", "after"]


@dataclass
class _Fault:
    #: Calls still to fail; None fails every call until ``heal()``.
    remaining: int | None
    when: When
    error: Callable[[], BaseException] | None


class FaultyStore(Generic[StoreT]):
    """A store that forwards every call to ``inner``, failing the steps it is told to.

    Why a wrapper rather than a subclass: it works the same for every store
    (Memory, SQLite, PostgreSQL, a user's own), the store under test keeps its
    real behaviour, and a fault is configured in the test that needs it::

        store = FaultyStore(MemoryStore())
        store.fail("commit", when="after")  # the next commit lands, its reply is lost
        ledger = build_ledger(store)

    Faults raise :class:`~agent_ledger.errors.EffectStoreError` ("connection
    lost", ``operation`` = the step) unless ``error`` gives another exception.
    ``calls`` counts every call per step (failed ones included) and
    ``failures`` the injected faults per step.
    """

    def __init__(self, inner: StoreT) -> None:
        self.inner: StoreT = inner
        self.calls: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._faults: dict[str, _Fault] = {}
        self._delays: dict[str, float] = {}

    # --- configuration -------------------------------------------------------

    def fail(
        self,
        *steps: str,
        times: int | None = 1,
        when: When = "before",
        error: Callable[[], BaseException] | None = None,
    ) -> None:
        """Fail the next ``times`` calls of each step (every call if ``times`` is None).

        ``when="after"`` applies the step first, then raises: the caller
        cannot tell whether it landed, which is what retries must survive.
        ``error`` builds the exception to raise (a fresh one per failure).
        A later ``fail`` of the same step replaces the earlier one.
        """
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1 (or None for 'until healed'), not {times}")
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {when!r}")
        for step in _checked(steps):
            self._faults[step] = _Fault(times, when, error)

    def slow(self, *steps: str, seconds: float) -> None:
        """Delay every call of each step by ``seconds`` before it reaches the store,
        like a round trip to a busy server (0 removes the delay)."""
        for step in _checked(steps):
            if seconds > 0:
                self._delays[step] = seconds
            else:
                self._delays.pop(step, None)

    def heal(self, *steps: str) -> None:
        """Stop failing the given steps (every step if none are given); delays stay."""
        for step in _checked(steps) if steps else tuple(self._faults):
            self._faults.pop(step, None)

    # --- the Store protocol, forwarded -----------------------------------------

    async def begin(
        self, new: NewEffect, *, tx: object | None = None, lock_timeout_ms: int | None = None
    ) -> BeginOutcome:
        return await self._step(
            "begin",
            lambda: self.inner.begin(new, tx=tx, lock_timeout_ms=lock_timeout_ms),
            idem_key=new.idem_key,
        )

    async def claim(
        self,
        idem_key: str,
        *,
        stale_after_ms: int,
        lease_ms: int | None = None,
        tx: object | None = None,
        lock_timeout_ms: int | None = None,
    ) -> ClaimOutcome:
        return await self._step(
            "claim",
            lambda: self.inner.claim(
                idem_key,
                stale_after_ms=stale_after_ms,
                lease_ms=lease_ms,
                tx=tx,
                lock_timeout_ms=lock_timeout_ms,
            ),
            idem_key=idem_key,
        )

    async def heartbeat(self, held: Sequence[Held]) -> HeartbeatOutcome:
        # A fault fails the whole batch, as a lost connection would.
        effect_id = held[0].effect_id if len(held) == 1 else None
        return await self._step(
            "heartbeat", lambda: self.inner.heartbeat(held), effect_id=effect_id
        )

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
        return await self._step(
            "commit",
            lambda: self.inner.commit(
                effect_id,
                attempt=attempt,
                status=status,
                result_json=result_json,
                error=error,
                tx=tx,
                ends_try=ends_try,
                usage_json=usage_json,
                started=started,
                retryable=retryable,
            ),
            effect_id=effect_id,
        )

    async def record_try(
        self, effect_id: str, *, attempt: int, error: EffectError, error_type: str
    ) -> bool:
        return await self._step(
            "record_try",
            lambda: self.inner.record_try(
                effect_id, attempt=attempt, error=error, error_type=error_type
            ),
            effect_id=effect_id,
        )

    async def release(self, effect_id: str, *, attempt: int, for_approval: bool = False) -> bool:
        return await self._step(
            "release",
            lambda: self.inner.release(effect_id, attempt=attempt, for_approval=for_approval),
            effect_id=effect_id,
        )

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
        return await self._step(
            "transition",
            lambda: self.inner.transition(
                idem_key, target=target, error=error, decision=decision, tx=tx, sources=sources
            ),
            idem_key=idem_key,
        )

    async def retry_failed(self, idem_key: str, *, attempt: int, lease_ms: int) -> ClaimOutcome:
        return await self._step(
            "retry_failed",
            lambda: self.inner.retry_failed(idem_key, attempt=attempt, lease_ms=lease_ms),
            idem_key=idem_key,
        )

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> Effect | None:
        return await self._step(
            "reopen", lambda: self.inner.reopen(idem_key, by=by, reason=reason), idem_key=idem_key
        )

    async def mark_started(
        self, effect_id: str, *, attempt: int, worker: str, tx: object | None = None
    ) -> bool:
        return await self._step(
            "mark_started",
            lambda: self.inner.mark_started(effect_id, attempt=attempt, worker=worker, tx=tx),
            effect_id=effect_id,
        )

    async def park(self, idem_key: str, *, stale_after_ms: int, error: EffectError) -> ClaimOutcome:
        return await self._step(
            "park",
            lambda: self.inner.park(idem_key, stale_after_ms=stale_after_ms, error=error),
            idem_key=idem_key,
        )

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
        return await self._step(
            "settle",
            lambda: self.inner.settle(
                idem_key,
                target=target,
                decision=decision,
                expected_attempt=expected_attempt,
                only_parked=only_parked,
                result_json=result_json,
                error=error,
            ),
            idem_key=idem_key,
        )

    async def get(self, effect_id: str, *, tx: object | None = None) -> Effect | None:
        return await self._step(
            "get", lambda: self.inner.get(effect_id, tx=tx), effect_id=effect_id
        )

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        return await self._step("find", lambda: self.inner.find(idem_key, tx=tx), idem_key=idem_key)

    async def find_legacy(self, legacy_key: str, *, tx: object | None = None) -> Effect | None:
        return await self._step("find_legacy", lambda: self.inner.find_legacy(legacy_key, tx=tx))

    async def list_effects(self, query: EffectQuery | None = None) -> list[Effect]:
        return await self._step("list_effects", lambda: self.inner.list_effects(query))

    async def stats(self) -> LedgerStats:
        return await self._step("stats", self.inner.stats)

    async def purge(self, *, older_than: timedelta, statuses: frozenset[EffectStatus]) -> int:
        return await self._step(
            "purge", lambda: self.inner.purge(older_than=older_than, statuses=statuses)
        )

    async def create_schema(self) -> None:
        await self._step("create_schema", self.inner.create_schema)

    async def migrate(self) -> SchemaMigration:
        return await self._step("migrate", self.inner.migrate)

    async def check_schema(self) -> int:
        return await self._step("check_schema", self.inner.check_schema)

    def subscribe(self, idem_key: str) -> AbstractAsyncContextManager[Subscription]:
        return self.inner.subscribe(idem_key)

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return self.inner.transaction()

    async def flush_counts(self) -> None:
        await self._step("flush_counts", self.inner.flush_counts)

    async def close(self) -> None:
        await self.inner.close()

    # --- the SagaStore protocol, forwarded ---------------------------------------

    def _sagas(self) -> SagaStore:
        inner = self.inner
        if not isinstance(inner, SagaStore):
            raise EffectLedgerValidationError(
                f"FaultyStore wraps a {type(inner).__name__}, which keeps no sagas "
                "(it does not implement agent_ledger.stores.saga_base.SagaStore)",
                field="store",
            )
        return inner

    async def begin_saga(self, new: NewSaga) -> SagaBegin:
        return await self._step("begin_saga", lambda: self._sagas().begin_saga(new))

    async def claim_saga(
        self,
        saga_id: str,
        *,
        expect: SagaStatus,
        then: SagaStatus,
        lease_ms: int,
        idle_ms: int,
        owner: str | None,
    ) -> SagaRecord | None:
        return await self._step(
            "claim_saga",
            lambda: self._sagas().claim_saga(
                saga_id, expect=expect, then=then, lease_ms=lease_ms, idle_ms=idle_ms, owner=owner
            ),
        )

    async def release_saga(self, saga_id: str, *, attempt: int) -> bool:
        return await self._step(
            "release_saga", lambda: self._sagas().release_saga(saga_id, attempt=attempt)
        )

    async def heartbeat_saga(self, saga_id: str, *, attempt: int) -> bool:
        return await self._step(
            "heartbeat_saga", lambda: self._sagas().heartbeat_saga(saga_id, attempt=attempt)
        )

    async def finish_saga(
        self,
        saga_id: str,
        *,
        attempt: int,
        expect: SagaStatus,
        then: SagaStatus,
        error: EffectError | None,
    ) -> bool:
        return await self._step(
            "finish_saga",
            lambda: self._sagas().finish_saga(
                saga_id, attempt=attempt, expect=expect, then=then, error=error
            ),
        )

    async def record_step(
        self, saga_id: str, *, attempt: int, step: NewSagaStep
    ) -> SagaStep | None:
        return await self._step(
            "record_step", lambda: self._sagas().record_step(saga_id, attempt=attempt, step=step)
        )

    async def get_saga(self, saga_id: str) -> SagaRecord | None:
        return await self._step("get_saga", lambda: self._sagas().get_saga(saga_id))

    async def saga_steps(self, saga_id: str) -> list[SagaStep]:
        return await self._step("saga_steps", lambda: self._sagas().saga_steps(saga_id))

    async def list_sagas(
        self, *, statuses: frozenset[SagaStatus] | None = None, limit: int = 100
    ) -> list[SagaRecord]:
        return await self._step(
            "list_sagas", lambda: self._sagas().list_sagas(statuses=statuses, limit=limit)
        )

    async def claimable_sagas(
        self, *, limit: int = 100, after: tuple[datetime, str] | None = None
    ) -> list[SagaRecord]:
        return await self._step(
            "claimable_sagas", lambda: self._sagas().claimable_sagas(limit=limit, after=after)
        )

    # --- the one place a fault happens ------------------------------------------

    async def _step(
        self,
        step: str,
        call: Callable[[], Awaitable[R]],
        *,
        idem_key: str | None = None,
        effect_id: str | None = None,
    ) -> R:
        self.calls[step] += 1
        delay = self._delays.get(step)
        if delay is not None:
            await asyncio.sleep(delay)
        fault = self._take_fault(step)
        if fault is None:
            return await call()
        if fault.when == "after":
            await call()
        self.failures[step] += 1
        if fault.error is not None:
            raise fault.error()
        raise EffectStoreError(
            "connection lost (injected by FaultyStore)",
            operation=step,
            idem_key=idem_key,
            effect_id=effect_id,
        )

    def _take_fault(self, step: str) -> _Fault | None:
        fault = self._faults.get(step)
        if fault is None or fault.remaining is None:
            return fault
        fault.remaining -= 1
        if fault.remaining == 0:
            del self._faults[step]
        return fault


def _checked(steps: tuple[str, ...]) -> tuple[str, ...]:
    """The steps, once each is known: a typo must fail the test, not inject nothing."""
    known = STORE_STEPS + SAGA_STEPS
    unknown = [s for s in steps if s not in known]
    if unknown or not steps:
        raise ValueError(f"unknown store steps {unknown or '(none given)'}; known: {known}")
    return steps


def build_ledger(
    store: Store,
    *,
    defaults: RunOptions | None = None,
    hooks: LedgerHooks | None = None,
    clock: ManualClock | None = None,
) -> EffectLedger:
    """An :class:`EffectLedger` on ``store``, with ``defaults`` for every ``run()``
    and ``hooks`` when ``run()`` is not given its own.

    With ``clock``, the ledger keeps its time by it and waits between retries
    with ``clock.sleep``, which moves the clock instead of sleeping (and
    notes each delay in ``clock.slept``).
    """
    timing: dict[str, Any] = {} if clock is None else {"clock": clock, "sleep": clock.sleep}
    return EffectLedger(
        EffectLedgerOptions(
            store=store,
            defaults=LedgerDefaults(run=defaults or RunOptions()),
            hooks=hooks,
            **timing,
        )
    )


#: A frontend message that runs a statement: simple Query, or extended-protocol Execute.
_SENT_STATEMENT = re.compile(r"F\t\d+\t(Query|Execute)\t")


class StatementCounter:
    """Count the statements PostgreSQL connections sent, from libpq's trace of the protocol.

    Attach it to every connection of a pool (``configure=counter.attach``),
    then ``mark()`` before a step and ``count()`` (or ``statements()``) after
    it. Every frontend ``Query`` (simple protocol) or ``Execute`` (extended
    protocol) message is one statement; BEGIN and COMMIT show up as ``Query``.
    Reading libpq's own trace, rather than wrapping the driver, counts what
    really went over the wire. Needs psycopg (the ``postgres`` extra).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.connections: list[AsyncConnection[Any]] = []
        self.offset = 0

    async def attach(self, conn: AsyncConnection[Any]) -> None:
        """Trace ``conn`` from now on (async, to fit a pool's ``configure=``)."""
        _trace(conn, self.fd)
        self.connections.append(conn)

    def lines(self) -> list[str]:
        """Every trace line so far (flushed first)."""
        for conn in self.connections:  # libpq buffers its trace: untrace flushes it
            conn.pgconn.untrace()
            _trace(conn, self.fd)
        return self.path.read_text().splitlines()

    def mark(self) -> None:
        """Start counting from here."""
        self.offset = len(self.lines())

    def statements(self) -> list[str]:
        """The statements sent since the last mark (their trace lines); marks again."""
        lines = self.lines()
        sent = [line for line in lines[self.offset :] if _SENT_STATEMENT.match(line)]
        self.offset = len(lines)
        return sent

    def count(self) -> int:
        """How many statements were sent since the last mark; marks again."""
        return len(self.statements())

    def close(self) -> None:
        """Close the trace file (the connections are the caller's)."""
        os.close(self.fd)


def _trace(conn: AsyncConnection[Any], fd: int) -> None:
    from psycopg import pq

    conn.pgconn.trace(fd)
    conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
