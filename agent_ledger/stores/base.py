"""The contract every store implements.

``NewEffect``, ``BeginOutcome`` and ``ClaimOutcome`` are NamedTuples rather
than frozen dataclasses because one of each is built on every ``run()``:
equally immutable and typed, several times cheaper to construct.

The ledger owns policy (which transition to ask for, waiting, hooks); a
store owns atomicity. Each method below is one atomic step, so a SQL store
can do it in one statement and one round trip. True/an effect means "this
call made the change"; False/None means "the precondition did not hold,
nothing changed" and is never an error. Backend failures raise
:class:`~agent_ledger.errors.EffectStoreError` (never double-wrapped);
a ``tx`` from another store raises ``EffectLedgerValidationError``.

Clocks: every timestamp, and every staleness judgement, uses the *store's*
clock (the database's for SQL stores), never the calling worker's.

Steps inside a caller's transaction
-----------------------------------
A step given ``tx`` runs inside the caller's transaction, and any lock it
takes is held until that transaction ends. So inside one, ``begin`` never
writes an existing effect, and ``begin`` and ``claim`` wait at most
``lock_timeout_ms`` (None: ``options.DEFAULT_TX_LOCK_TIMEOUT_MS``) for a lock
another transaction holds on the key, such as an uncommitted insert or claim
of it. Past that they raise ``EffectInFlightError`` (``status=None``), change
nothing, and leave the caller's transaction usable. Without ``tx``,
``lock_timeout_ms`` is ignored. MemoryStore and SqliteStore ignore it too:
their transactions exclude every other writer from the start, so nothing
inside one waits.

Which steps are safe to repeat
------------------------------
A step whose reply is lost (the connection broke after the server acted)
leaves the caller not knowing whether it happened. Repeating it blindly is
safe only for some steps; :data:`STEP_REPEATABLE` says which, and
PostgresStore's one retry on a fresh connection follows it. Each step keeps
its name everywhere: the method, the ``operation`` of its errors, and here.

=============== ======= =====================================================
step            repeat  why
=============== ======= =====================================================
begin           yes     If the lost try inserted the effect, the repeat finds
                        it held by "someone else" (``created=False``, one
                        more duplicate counted) and waits out the stale
                        window before taking it over: a delay, never a
                        second execution.
claim           yes     Likewise: a repeat after a lost winning claim finds
                        the effect processing with a fresh heartbeat and
                        waits for it to go stale: a delay, never two holders.
heartbeat       yes     Setting ``heartbeat_at=now`` twice is setting it once,
                        for each effect of the batch.
commit          no      A repeat after a landed commit matches no row and
                        returns False, indistinguishable from losing to
                        another attempt. The ledger retries it itself and
                        then reads the effect (``get``): its own attempt and
                        status there mean the lost try won.
record_try      no      A repeat after a landed record counts the try twice.
                        The ledger retries it itself and then reads the
                        effect: its own attempt, still processing, with the
                        count it expected, means the lost record landed.
release         no      A repeat after a landed release returns False (the
                        effect is ``ready`` now), indistinguishable from
                        having lost it to a takeover or a decision. The
                        ledger never repeats it: a release that failed leaves
                        the effect to its lease, as a crash would.
transition      no      A repeat after a landed decision returns None, so
                        ``approve()`` would report False for an approval
                        that was recorded. Decisions are not retried.
reopen          no      Likewise: a repeat after a landed reopen finds the
                        effect ``ready`` and returns None.
retry_failed    yes     Like a claim: a repeat after a landed retry finds the
                        effect processing at the next attempt (not failed),
                        changes nothing and returns ``claimed=False``; the
                        caller waits out the lease of the attempt it lost
                        track of: a delay, never a second execution.
mark_started    yes     Setting ``park_attempt`` to the attempt it already is,
                        and the worker to the same name, is setting it once.
park            yes     A repeat after a landed park finds the effect
                        ``requires_approval`` and returns it unparked: the
                        caller waits for a person either way.
settle          no      Like a decision: a repeat after a landed settle
                        returns None, so ``approve()`` would report False.
get, find       yes     Reads.
find_legacy     yes     A read.
list_effects    yes     A read.
stats           yes     A read (after writing the caller's pending duplicate
                        counts: a flush, which is safe to repeat too).
flush_counts    yes     A flush whose reply was lost is never sent again (its
                        counts are dropped, see ``stores/_dedup.py``), so a
                        repeat writes only what is still pending.
purge           no      A repeat deletes nothing the lost try deleted, so its
                        count would be wrong; the caller sees the error and
                        may run purge again knowingly.
create_schema   yes     Idempotent by design (``IF NOT EXISTS``; serialized).
migrate         yes     The same work as create_schema; a repeat after a
                        landed upgrade reports it found the newest version.
check_schema    yes     A read.
=============== ======= =====================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final, NamedTuple, Protocol, runtime_checkable

from agent_ledger.context import StepProgress as StepProgress  # its home: the context
from agent_ledger.context import step_progress
from agent_ledger.effects import Effect, EffectError
from agent_ledger.effects import NewEffect as NewEffect  # its home; kept importable here
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.status import (
    COMPLETIONS,
    DECISION_TARGETS,
    SETTLE_TARGETS,
    EffectStatus,
    decision_sources,
)

#: Whether each store step may be repeated blindly after a lost reply; the
#: module doc's table says why. Keys are the step names of :class:`Store`.
STEP_REPEATABLE: Final[Mapping[str, bool]] = MappingProxyType(
    {
        "begin": True,
        "claim": True,
        "heartbeat": True,
        "commit": False,
        "record_try": False,
        "release": False,
        "transition": False,
        "reopen": False,
        "retry_failed": True,
        "mark_started": True,
        "park": True,
        "settle": False,
        "get": True,
        "find": True,
        "find_legacy": True,
        "list_effects": True,
        "stats": True,
        "flush_counts": True,
        "purge": False,
        "create_schema": True,
        "migrate": True,
        "check_schema": True,
    }
)
#: The steps a store may run again, on a fresh connection, after a lost reply.
REPEATABLE_STEPS: Final[frozenset[str]] = frozenset(
    step for step, repeatable in STEP_REPEATABLE.items() if repeatable
)


class BeginOutcome(NamedTuple):
    """``effect`` as stored after ``begin``; ``created`` tells insert from existing."""

    effect: Effect
    created: bool


class ClaimOutcome(NamedTuple):
    """``effect`` as stored after ``claim`` (None if no such key); ``claimed`` if this call won."""

    effect: Effect | None
    claimed: bool


class SchemaMigration(NamedTuple):
    """What ``Store.migrate`` did: the schema version it found, and the one it left.

    Equal versions mean there was nothing to do. ``from_version`` is 0 when
    there was no schema at all (it was created).
    """

    from_version: int
    to_version: int

    @property
    def changed(self) -> bool:
        return self.to_version != self.from_version


class Held(NamedTuple):
    """An effect a worker holds: its id, at the attempt it claimed (the fencing token)."""

    effect_id: str
    attempt: int


class HeartbeatOutcome(NamedTuple):
    """What ``heartbeat`` found for each effect of a batch.

    An effect of the batch in neither set is no longer held by the caller
    (finished, canceled, taken over by a later attempt, or unknown).
    """

    #: Still held; ``heartbeat_at`` is now the store's current time.
    refreshed: frozenset[Held]
    #: Still held as last committed, but another transaction had its row
    #: locked, so it was skipped rather than waited for: one locked row must
    #: not hold up every other effect of the batch. Not refreshed this time;
    #: send it again next time. Always empty on stores without row locks.
    busy: frozenset[Held] = frozenset()


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's decision on an effect: recorded with approve, deny and cancel."""

    by: str | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class EffectQuery:
    """Filters and a keyset position for listing effects, newest first.

    Effects are ordered by ``(created_at, id)`` descending; ``before`` is the
    ``(created_at, id)`` of the last effect of the previous page, so pages
    stay stable while new effects arrive. ``since`` is inclusive, ``until``
    exclusive, both on ``created_at``.
    """

    workflow_id: str | None = None
    tool: str | None = None
    status: EffectStatus | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 100
    before: tuple[datetime, str] | None = None
    #: Lowercase hex; matches effects whose idempotency key starts with it.
    idem_key_prefix: str | None = None
    #: Exactly this ``call_id``.
    call_id: str | None = None
    #: Exactly this ``error.code``.
    error_code: str | None = None
    #: Handler time (``effects.handler_time``, by the store's clock) at least /
    #: at most this, both inclusive; effects without one never match.
    min_duration: timedelta | None = None
    max_duration: timedelta | None = None


@dataclass(frozen=True, slots=True)
class LedgerStats:
    """Counts over every stored effect."""

    total: int
    #: Every status, including those with no effects (0).
    by_status: Mapping[EffectStatus, int]
    by_tool: Mapping[str, int]
    #: Calls that found an existing effect, outside transactions (sum of
    #: ``dedup_count``): mostly answered from its receipt, but a repeat may
    #: also have waited for it, or run it once it was approved.
    duplicates: int


class Subscription(Protocol):
    """Change notifications for one idem key, buffered from the moment of subscribing."""

    async def wait(self, timeout_s: float) -> bool:
        """Return True as soon as the effect changed since the last ``wait``
        (or since subscribing), False after ``timeout_s`` without a change.

        A store without notifications just sleeps and returns False: the
        ledger's polling then does all the work.
        """
        ...


@contextlib.contextmanager
def waiting_before_work() -> Iterator[None]:
    """For a store: wrap a wait that comes before the step does anything (a
    cancellation there leaves the store as it was)."""
    progress = step_progress()
    if progress is None:
        yield
        return
    progress.waiting = True
    try:
        yield
    finally:
        progress.waiting = False


@runtime_checkable
class Store(Protocol):
    """A place to keep effects; see the module doc for the shared rules."""

    async def create_schema(self) -> None:
        """Create what the store needs to keep effects (tables, indexes), if missing.

        Idempotent and safe for several workers at once. A store with nothing
        to create (MemoryStore) does nothing; SqliteStore already did it on
        opening unless told ``create=False``.
        """
        ...

    async def migrate(self) -> SchemaMigration:
        """Bring the schema to this library's version, creating it if missing.

        Applies each version the store lacks, in order, each exactly once
        however many processes migrate at the same time (they take turns; the
        later ones find nothing to do), and reports the version found and
        the version left. Idempotent: on a current schema it changes nothing.
        A failed upgrade leaves the schema as it was. MemoryStore has nothing
        to migrate.
        """
        ...

    async def check_schema(self) -> int:
        """The schema version the store finds; raise ``EffectStoreError`` saying how to
        fix it if the schema is missing or older than this library needs."""
        ...

    async def begin(
        self, new: NewEffect, *, tx: object | None = None, lock_timeout_ms: int | None = None
    ) -> BeginOutcome:
        """Insert-or-get, atomically.

        If ``new.idem_key`` is unknown, insert it as ``processing`` (or
        ``requires_approval`` when ``new.requires_approval``) with
        ``attempt=1``, ``dedup_count=0``, ``heartbeat_at=now`` and
        ``lease_ms=new.lease_ms``; as processing it also gets
        ``executions=1`` and ``started_at=now`` (0 and None otherwise). Return
        ``created=True``. Otherwise count one duplicate (``dedup_count`` + 1,
        and nothing else: a duplicate must never refresh liveness) and return
        the stored effect with ``created=False``. Exactly one of any number of
        concurrent begins for a key gets ``created=True``.

        The SQL stores answer an existing *finished* effect with one read that
        takes no lock and writes nothing, and write those duplicates' counts
        later, in batches (see :meth:`flush_counts`); the effect they return
        already includes this call's count, as every read in the same process
        does. A duplicate of an effect still open is counted at once: a
        caller that may wait for it must be counted before the holder commits
        (PostgreSQL's notify trigger stays quiet for a commit nobody counted).

        With ``tx``, an existing effect is only read, never written (its
        ``dedup_count`` stays as it is): a write would lock its row until the
        caller's transaction ends, and the holder's heartbeats and commit
        would queue behind that lock. ``lock_timeout_ms``: see "Steps inside
        a caller's transaction" in the module doc.
        """
        ...

    async def claim(
        self,
        idem_key: str,
        *,
        stale_after_ms: int,
        lease_ms: int | None = None,
        tx: object | None = None,
        lock_timeout_ms: int | None = None,
    ) -> ClaimOutcome:
        """Take the effect over if it is claimable, atomically.

        Claimable means a status in ``agent_ledger.status.CLAIMABLE``
        (``ready``, or ``processing`` itself). ``processing`` (a takeover)
        only when neither side turned takeovers off (``stale_after_ms`` and
        the holder's ``lease_ms`` both above 0) and ``heartbeat_at`` is at
        least the longer of the two old, by the store's clock: the holder's
        lease is never shortened by a caller's smaller window. Claiming sets
        ``processing``, increments ``attempt`` and ``executions``, sets
        ``heartbeat_at=started_at=now`` and records ``lease_ms`` (by default
        ``stale_after_ms``) as the new holder's lease; concurrent claims of one effect have
        exactly one winner. Returns the effect as it now stands
        whether or not this call claimed it, so a waiter's poll costs one
        round trip. ``lock_timeout_ms``: see "Steps inside a caller's
        transaction" in the module doc.
        """
        ...

    async def heartbeat(self, held: Sequence[Held]) -> HeartbeatOutcome:
        """Set ``heartbeat_at=now`` on each effect of ``held`` that is still
        ``processing`` at its attempt, in one atomic step for the whole batch.

        One call per tick for every effect a ledger runs, so heartbeats cost
        one statement (SQL stores) however many handlers run. An effect that
        is no longer held (finished, canceled, taken over by a later attempt,
        an unknown id) is in neither set of the outcome. A store whose rows
        can be locked by other transactions (PostgreSQL) skips a locked row
        and reports it ``busy`` instead of waiting for it. An empty batch
        returns an empty outcome without touching the backend.
        PostgresStore sends it on a connection of its own, never a pool
        connection, so heartbeats do not wait behind the application.
        """
        ...

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
        """Compare-and-set ``processing`` -> ``status`` (succeeded, failed or canceled).

        Applies only if the effect is ``processing`` and, when ``attempt`` is
        given, still at that attempt (fencing: a late worker never
        overwrites the winner). Records ``result_json`` (JSON text) or
        ``error`` (and ``usage_json``, a model call's ``Usage`` as JSON text, in
        the same step), and ``completed_at=updated_at=now``; with ``ends_try``
        (the default: the outcome is a try's) adds one to ``tries``. With
        ``started=False`` (this attempt's handler never started: a claim the
        engine then refused to run) it takes back the one its claim added to
        ``executions``, which counts handler starts only. With ``retryable``
        (a ``failed`` outcome only) it appends a ``RetryableFailure`` to
        ``history`` in the same step (``attempt``, ``error``'s message and
        code, ``at=now``), which makes the effect ``Effect.retryable``. First
        commit wins; every later one returns False. Wakes subscribers.
        """
        ...

    async def record_try(
        self, effect_id: str, *, attempt: int, error: EffectError, error_type: str
    ) -> bool:
        """Record one failed try of a retried handler, in one atomic step.

        Applies only if the effect is ``processing`` at exactly ``attempt``
        (fencing: a holder that was taken over or canceled records nothing).
        Adds one to ``tries`` and appends a ``TryFailure`` to ``history``
        (``number`` = the new ``tries``, ``error``'s message and code,
        ``error_type`` the exception's qualified class name, ``at=now``), and
        refreshes ``heartbeat_at``; the status does not change, so nobody is
        woken. True if it applied; False, changing nothing, otherwise
        (unknown id included): the holder must stop trying. Never called
        inside a caller's transaction.
        """
        ...

    async def release(self, effect_id: str, *, attempt: int, for_approval: bool = False) -> bool:
        """Give an effect back unrun: compare-and-set ``processing`` at ``attempt``
        -> ``ready`` (``requires_approval`` with ``for_approval``).

        For a holder whose run was cancelled after its begin or claim landed
        and before its handler started: the effect becomes claimable at once
        (``status.RELEASE``) instead of waiting out a lease nobody holds.
        Applies only if the effect is ``processing`` at exactly ``attempt``
        (fencing: a stale holder never releases its taker's effect). Takes
        one off ``executions``, since the handler never started, and clears
        ``started_at`` when that leaves none; sets ``updated_at=now``; leaves
        ``attempt``, ``lease_ms`` and ``heartbeat_at`` as they are. Returns
        False, changing nothing, otherwise (unknown id included). Wakes
        subscribers, so a waiter claims the effect at once. Never called
        inside a caller's transaction (that one rolls back instead).

        ``for_approval``: the holder decided, before running the handler,
        that a person must approve the call first (``request_approval`` by
        the holder, 0.2.x's worker flow; ``status.HOLD``). The same fenced
        step, to ``requires_approval`` instead: nobody can claim the effect
        until a person approves it. Waiters wake and wait for the decision.
        """
        ...

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
        """Compare-and-set the effect to ``target`` from any status allowed by
        ``agent_ledger.status.decision_sources(target)`` (never from
        ``processing`` to ``ready``: that is :meth:`release`, by the holder).

        ``sources`` narrows the statuses it moves from (a non-empty subset of
        ``decision_sources(target)``, see :func:`transition_sources`): a saga
        cancels a step only while it still waits for a person, never once a
        worker claimed it, in one statement with no window between the read
        and the move.

        Used for request_approval, approve, deny and cancel. ``error``
        records the reason for ``denied``/``canceled``; ``decision``, when
        given, is recorded as ``decided_by``/``decision_note`` with
        ``decided_at=now``; ``completed_at`` is set when ``target`` is
        terminal. Returns the updated effect, or None if the key is unknown
        or its status does not allow the move. Wakes subscribers.

        ``target=processing`` raises ``EffectLedgerValidationError``
        (``field="target"``) and changes nothing: only :meth:`claim` moves an
        effect into processing, because only a claim increments ``attempt``.
        """
        ...

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> Effect | None:
        """Send a finished effect back to be run again: compare-and-set from
        ``status.REOPENABLE`` (``failed``, ``canceled``) to ``ready``.

        Appends a ``Reopening`` to ``history`` recording how the effect had
        ended (its status, error and tries), ``by``, ``reason`` and
        ``at=now``; then clears ``error`` and ``completed_at``, sets ``tries``
        to 0 (the next run counts afresh) and records the reopening as the
        latest decision (``decided_by=by``, ``decision_note=reason``,
        ``decided_at`` the same ``now``). ``attempt`` stays: the next claim
        increments it, which is what fences off a handler still running from
        before a cancel. Returns the updated effect, or None if the key is
        unknown or the status does not allow it. Wakes subscribers.
        """
        ...

    async def retry_failed(self, idem_key: str, *, attempt: int, lease_ms: int) -> ClaimOutcome:
        """Run a failed effect again, for a later call after a retryable failure
        (``status.RETRY``): compare-and-set ``failed`` at exactly ``attempt`` ->
        ``processing`` at ``attempt + 1``, held by the caller.

        Fenced by the failed attempt, so of any number of callers that read
        the same failure exactly one wins (``claimed=True``); the others get
        the effect as it then stands (held by the winner) and wait for it.
        Like a claim it adds one to ``executions``, records ``lease_ms`` and
        sets ``heartbeat_at``, ``started_at`` and ``updated_at`` to now; like
        a reopen it clears ``error``, ``result``, ``usage`` and
        ``completed_at`` and starts ``tries`` again at 0. ``history`` keeps the
        failure (its ``RetryableFailure``, appended by the commit). Whether
        the failure may be retried is the ledger's policy
        (``Effect.retryable``), not checked here. ``(None, False)`` for an
        unknown key. Wakes subscribers.
        """
        ...

    async def mark_started(
        self, effect_id: str, *, attempt: int, worker: str, tx: object | None = None
    ) -> bool:
        """Record that the handler of ``attempt`` starts now, under ``on_stale="park"``.

        Compare-and-set on ``processing`` at exactly ``attempt`` (fencing):
        sets ``park_attempt=attempt``, ``worker`` and ``heartbeat_at=now``.
        From then on, a takeover (:meth:`claim`) never takes this attempt
        over: should its holder go silent, only :meth:`park` moves it. True if
        it applied; False, changing nothing, otherwise (the effect is no
        longer the caller's: it must not run the handler).
        """
        ...

    async def park(self, idem_key: str, *, stale_after_ms: int, error: EffectError) -> ClaimOutcome:
        """Send an ambiguous attempt to a person (``status.PARK``), atomically.

        Applies only if the effect is ``processing``, its ``park_attempt`` is
        its current ``attempt`` (the handler started under park), and its
        holder is stale exactly as :meth:`claim` judges a takeover (both
        windows above 0, heartbeat at least the longer of the two old). Sets
        ``requires_approval`` with ``error`` (its code ``ambiguous_attempt``)
        and appends a ``Parked`` event (the attempt, its ``started_at``,
        ``worker`` and last ``heartbeat_at``, and ``at=now``); ``attempt``
        stays. Of a park and concurrent claims, heartbeats or commits exactly
        one applies. Returns the effect as it now stands, ``claimed`` True
        when this call parked it (None effect: no such key). Wakes
        subscribers.
        """
        ...

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
        """A person's approve, deny or resolve: compare-and-set ``requires_approval``
        -> ``target`` (one of ``status.SETTLE_TARGETS``).

        Applies only at ``expected_attempt`` when given (the attempt the
        person saw), and with ``only_parked`` only to a parked effect (error
        code ``ambiguous_attempt``). Sets ``result`` to ``result_json`` and
        ``error`` to ``error`` (both None clear them), records the decision
        (``decided_by``, ``decision_note``, ``decided_at=now``), sets
        ``completed_at`` when ``target`` is terminal, and appends a
        ``Settlement`` (target, attempt, by, note, at). Returns the updated
        effect, or None, changing nothing, when the precondition did not
        hold. Wakes subscribers. A ``target`` outside ``SETTLE_TARGETS``
        raises ``EffectLedgerValidationError``.
        """
        ...

    async def get(self, effect_id: str, *, tx: object | None = None) -> Effect | None:
        """The effect with this id, or None."""
        ...

    async def find(self, idem_key: str, *, tx: object | None = None) -> Effect | None:
        """The effect with this idempotency key, or None."""
        ...

    async def find_legacy(self, legacy_key: str, *, tx: object | None = None) -> Effect | None:
        """The effect agent-ledger 0.2.x's key ``legacy_key`` was imported as, or None.

        ``agent-ledger import-0.2`` records, for each row it brings over, the
        row's 0.2.x key and the key of the effect it became; this reads that
        effect in one step, for ``EffectLedgerOptions(legacy_keys=True)``
        (called only with that option on). None when the key was never
        imported, or its effect has since been purged.
        """
        ...

    async def list_effects(self, query: EffectQuery | None = None) -> list[Effect]:
        """Up to ``query.limit`` effects matching every given filter, newest first.

        With no query, agent-ledger 0.2.x's bare call: every effect, oldest first,
        with a ``DeprecationWarning`` (``stores._legacy.all_effects``)."""
        ...

    async def stats(self) -> LedgerStats:
        """Counts by status and tool, and the total of duplicates."""
        ...

    async def flush_counts(self) -> None:
        """Write every duplicate this store has counted and not yet written, now.

        The SQL stores count duplicates in memory and write them in one
        statement for all keys every flush interval (the store's
        ``dedup_flush_interval_s``), here, on ``stats`` and on ``close``.
        Effects this process reads always include its own counts; other
        processes see them once written. A failed write raises
        ``EffectStoreError`` and keeps them for the next try. MemoryStore
        counts at once: nothing to do.
        """
        ...

    async def purge(self, *, older_than: timedelta, statuses: frozenset[EffectStatus]) -> int:
        """Delete effects in ``statuses`` (terminal ones only) completed at least
        ``older_than`` ago by the store's clock, atomically; return how many.

        An effect a saga records as a step or as a step's undo is kept:
        sagas are never purged, and a saga whose steps had gone would read
        as one whose steps never ran.
        """
        ...

    def subscribe(self, idem_key: str) -> AbstractAsyncContextManager[Subscription]:
        """Listen for changes to one key while the context is open."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[object]:
        """Open a transaction whose handle can be passed as ``tx``.

        Writes made with it become visible to others, and wake subscribers,
        only when the block exits normally; an exception rolls them back.
        """
        ...

    async def close(self) -> None:
        """Write pending duplicate counts (see ``flush_counts``; a failure is logged),
        then release what the store itself opened (not what the user passed in)."""
        ...


class SchemaCheck:
    """Checks a store's schema version once, on the ledger's first use of it.

    A database migrated by a newer release, or never given the tables, fails
    the first call with one message naming the found and needed versions,
    instead of a confusing SQL error deep inside some step. ``ok`` is read on
    every call, so checking costs one attribute read after the first time.
    """

    __slots__ = ("_store", "ok")

    def __init__(self, store: Store) -> None:
        self._store = store
        self.ok = False

    async def ensure(self, tx: object | None = None) -> None:
        """Check unless done; inside a caller's transaction, leave it to a later call.

        ``check_schema`` runs outside any transaction, and on the stores that
        serialize transactions (Memory, SQLite) such a step waits for the open
        one to end: from inside it, it would wait for itself.
        """
        if not self.ok and tx is None:
            await self._store.check_schema()
            self.ok = True


def check_commit_status(status: EffectStatus) -> None:
    """Raise unless ``status`` is one ``Store.commit`` may set (``status.COMPLETIONS``)."""
    if status not in COMPLETIONS:
        raise EffectLedgerValidationError(
            f"commit() finishes an effect; {status.value!r} is not a terminal status "
            "reachable from processing",
            field="status",
        )


def check_transition_target(target: EffectStatus) -> None:
    """Raise unless ``target`` is one ``Store.transition`` may set (``status.DECISION_TARGETS``).

    ``processing`` is refused: only ``claim`` moves an effect into processing,
    since only a claim increments ``attempt``, the fencing token.
    """
    if target not in DECISION_TARGETS:
        raise EffectLedgerValidationError(
            f"transition() cannot set {target.value!r}: only claim() moves an effect into "
            "processing",
            field="target",
        )


def check_settle_target(target: EffectStatus) -> None:
    """Raise unless ``target`` is one ``Store.settle`` may set (``status.SETTLE_TARGETS``)."""
    if target not in SETTLE_TARGETS:
        raise EffectLedgerValidationError(
            f"settle() moves a waiting effect to ready, denied, succeeded or failed; "
            f"not to {target.value!r}",
            field="target",
        )


def transition_sources(
    target: EffectStatus, sources: frozenset[EffectStatus] | None
) -> frozenset[EffectStatus]:
    """The statuses ``Store.transition(target=target, sources=sources)`` moves from:
    ``decision_sources(target)``, or ``sources`` if given, which must be a
    non-empty subset of it (a narrower compare-and-set, never a wider one)."""
    allowed = decision_sources(target)
    if sources is None:
        return allowed
    if (
        not isinstance(sources, frozenset)
        or not sources
        or not all(isinstance(s, EffectStatus) for s in sources)
        or not sources <= allowed
    ):
        names = sorted(s.value for s in allowed)
        raise EffectLedgerValidationError(
            f"transition() to {target.value!r} takes sources as a non-empty frozenset of "
            f"statuses among {names}, got {sources!r}",
            field="sources",
        )
    return sources


def check_purge_statuses(statuses: frozenset[EffectStatus]) -> None:
    """Raise unless ``statuses`` is a non-empty set of terminal statuses (purge never
    removes an effect that could still change)."""
    live = sorted(s.value for s in statuses if not s.is_terminal)
    if not statuses or live:
        raise EffectLedgerValidationError(
            f"purge removes terminal effects only; not allowed: {live or 'an empty set'}",
            field="statuses",
        )
