"""Spend budgets, enforced around tool and model calls: reserve, run, book.

The budget rides in a context variable beside the workflow id: entering
``ledger.workflow(id, budget=...)`` (or ``ledger.saga(id, budget=...)``)
pushes it, and every tool call and ``ledger.llm()`` call inside (tasks
started inside included) goes through :func:`gate`:

1. **Reserve** the call's estimate on every budget in scope (the outermost
   first: a nested workflow's calls count against its parents' budgets too,
   so nesting never escapes a limit). One atomic store step per budget. If
   it does not fit, expired holds are reclaimed and it is tried once more;
   then, unless the effect already finished (a replay needs no room), the
   reservations already made are released and ``BudgetExceededError`` is
   raised *before* the handler or the provider is called.
2. **Run** the call through ``ledger.run()``.
3. **Settle**, whatever happened (a cancellation included, shielded): read
   the effect; if it finished, book its charge (from its receipt: a model
   call's ``usage``, one tool call per run that reached its handler) once
   per effect and release this call's hold and the effect's holds made
   before that run finished (a rerun's, after a reopen, keep their room);
   otherwise release this call's own holds (an effect's callers share its
   room: the store keeps it while any of their holds is left, so a waiter
   leaving takes nothing from the call still running). A plain
   ``call_fn``'s thread still running after a cancellation has its holds
   detached into rooms of their own and is waited for in the background,
   its usage booked beside the effect's charge (``Threads``).

Inside ``ledger.replay()`` the budgets are the replay's own (``Replay.budgets``,
in memory): a call served from the recording books its recorded charge
there, so the recorded run's refusals recur; nothing is stored.

Nothing here is inside the engine: the engine runs effects and records
their usage, and knows nothing of budgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, TypeVar

from agent_ledger.budgets import Budget, BudgetState, Spend, usd_to_micros
from agent_ledger.context import budget_scopes, budgets_gated, recording
from agent_ledger.effects import Effect
from agent_ledger.engine.cancellation import carry_through
from agent_ledger.errors import (
    BudgetExceededError,
    BudgetMismatchError,
    EffectLedgerValidationError,
)
from agent_ledger.status import EffectStatus
from agent_ledger.stores.budget_base import UNITS, BudgetStore, NewHold, detached_key

if TYPE_CHECKING:
    from agent_ledger.core import LedgerCore

__all__ = [
    "BudgetScope",
    "Threads",
    "active_budgets",
    "gate",
    "llm_charge",
    "open_budgets",
    "tool_charge",
]

logger = logging.getLogger("agent_ledger")
_T = TypeVar("_T")

#: How long a hold keeps its room when nobody books or releases it (its caller
#: crashed mid-call): 15 minutes, longer than any model call should take.
DEFAULT_HOLD_TTL_MS: Final = 15 * 60 * 1000
#: The units a tool call counts in, and a model call.
TOOL_UNITS: Final = frozenset({"tool_calls"})
LLM_UNITS: Final = frozenset({"usd_micros", "input_tokens", "output_tokens"})


def _simulated(ledger: LedgerCore[object]) -> BudgetStore | None:
    """Inside ``ledger.replay()``: the replay's own budgets (``Replay.budgets``),
    which simulate the recorded run's and store nothing; else None."""
    answering = recording()
    if answering is None or answering.ledger is not ledger:
        return None
    simulated = getattr(answering, "budgets", None)
    return simulated if isinstance(simulated, BudgetStore) else None


def budget_store(ledger: LedgerCore[object]) -> BudgetStore:
    """Where the ledger's budgets are kept: its store, or inside a replay the
    replay's simulated budgets; a clear error if the store keeps none."""
    simulated = _simulated(ledger)
    if simulated is not None:
        return simulated
    store = ledger.store
    if not isinstance(store, BudgetStore):
        raise EffectLedgerValidationError(
            f"budgets need a store that keeps them (MemoryStore, SqliteStore, "
            f"PostgresStore); {type(store).__name__} does not. Nothing was stored.",
            field="budget",
        )
    return store


class BudgetScope:
    """One budget attached to one workflow id of one ledger.

    Stored (or checked against the stored one) once, on the first use:
    ``async with`` does it on entering, so a mismatch fails at the top of
    the block; a sync ``with`` at the first call inside.

    A scope made by :meth:`stored` (``ledger.workflow(id)`` without
    ``budget=``) attaches whatever budget is stored for the id: it is read
    once, on the same first use, and the scope counts for nothing if none
    is stored. So a second worker (or an adapter) that enters the workflow
    without repeating the budget is still held to it.
    """

    __slots__ = ("_opened", "budget", "given", "ledger", "store", "workflow_id")

    def __init__(self, ledger: LedgerCore[object], workflow_id: str, budget: Budget) -> None:
        if not isinstance(budget, Budget):
            raise EffectLedgerValidationError(
                f"budget must be an agent_ledger.Budget, got {type(budget).__name__}. "
                "Nothing was stored.",
                field="budget",
            )
        self.ledger = ledger
        self.store = budget_store(ledger)
        self.workflow_id = workflow_id
        self.budget: Budget | None = budget
        #: Whether the caller gave the budget (False: the stored one, if any, is used).
        self.given = True
        self._opened = False

    @classmethod
    def stored(cls, ledger: LedgerCore[object], workflow_id: str) -> BudgetScope | None:
        """A scope for the budget stored under ``workflow_id``, if any; None when the
        ledger's store keeps no budgets."""
        store = _simulated(ledger) or ledger.store
        if not isinstance(store, BudgetStore):
            return None
        scope = cls.__new__(cls)
        scope.ledger = ledger
        scope.store = store
        scope.workflow_id = workflow_id
        scope.budget = None
        scope.given = False
        scope._opened = False
        return scope

    async def open(self) -> BudgetState | None:
        """Store the budget, or check it against the stored one; its state (None:
        a :meth:`stored` scope whose id has no budget)."""
        if not self.given:
            state = await self.store.get_budget(self.workflow_id)
            self.budget = None if state is None else state.limits
            self._opened = True
            return state
        assert self.budget is not None
        state = await self.store.open_budget(self.workflow_id, self.budget)
        if not state.limits.same_limits(self.budget):
            raise BudgetMismatchError(self.workflow_id, state.limits, self.budget)
        self._opened = True
        return state

    async def ensure_open(self) -> None:
        if not self._opened:
            await self.open()

    def __repr__(self) -> str:
        return f"BudgetScope({self.workflow_id!r}, {self.budget!r})"


def active_budgets(ledger: LedgerCore[object]) -> tuple[BudgetScope, ...]:
    """The budgets in scope for ``ledger``'s calls, outermost first, one per workflow id.

    A workflow id entered twice (a helper re-entering the workflow it is in)
    is one budget: reserving on it twice would count the call twice. The
    scope that was given its budget wins over one that looks it up.
    """
    scopes = budget_scopes()
    if not scopes or not budgets_gated():
        return ()
    if len(scopes) == 1:  # one workflow block around the call: the common case, on every call
        (only,) = scopes
        return (only,) if isinstance(only, BudgetScope) and only.ledger is ledger else ()
    chosen: dict[str, BudgetScope] = {}
    for scope in scopes:
        # Only this layer enters budget scopes (a workflow's or a saga's).
        if not isinstance(scope, BudgetScope) or scope.ledger is not ledger:
            continue
        seen = chosen.get(scope.workflow_id)
        if seen is None or (scope.given and not seen.given):
            chosen[scope.workflow_id] = scope
    return tuple(chosen.values())


async def open_budgets(ledger: LedgerCore[object]) -> tuple[BudgetScope, ...]:
    """:func:`active_budgets`, each stored or looked up (once per scope), without
    the looked-up ones that found no budget."""
    scopes = active_budgets(ledger)
    if not scopes:
        return ()
    for scope in scopes:
        if not scope._opened:  # looked up once per scope; no coroutine on later calls
            await scope.open()
    return tuple(s for s in scopes if s.budget is not None)


def tool_charge(effect: Effect) -> Spend:
    """What a finished tool effect costs: one tool call per run of the call that
    reached its handler (``executions``): a retry policy's tries inside one run
    count once; a reopened or taken-over effect ran again, and counts again."""
    return Spend(tool_calls=effect.executions)


def llm_charge(effect: Effect) -> Spend:
    """What a finished model call costs: its recorded usage (nothing if none)."""
    usage = effect.usage
    if usage is None:
        return Spend()
    cost = 0 if usage.cost_usd is None else usd_to_micros(usage.cost_usd, field="cost_usd")
    return Spend(cost, usage.input_tokens, usage.output_tokens, 0)


async def gate(
    ledger: LedgerCore[object],
    scopes: tuple[BudgetScope, ...],
    *,
    idem_key: str,
    tool: str,
    estimate: Spend,
    units: frozenset[str],
    charge: Callable[[Effect], Spend],
    run: Callable[[], Awaitable[_T]],
    hold_ttl_ms: int = DEFAULT_HOLD_TTL_MS,
    threads: Threads | None = None,
) -> _T:
    """Reserve on every scope, run, settle (see the module doc).

    ``threads``: the call's handler runs in worker threads (a plain
    ``call_fn``), which a cancellation does not stop. If one is still running
    when ``run`` ends (the caller was cancelled), the settling waits for it
    in the background, so the holds keep their room until it ends, and books
    at least what it used; the caller's cancellation is not delayed.

    Such a thread's usage is on no receipt (the run was recorded ``canceled``
    before it answered): its holds are detached from the effect's room
    first (``BudgetStore.detach_hold``: a rerun of the effect, after a
    reopen, must find room of its own, not join them), and what it used is
    booked *beside* the effect's charge, under the hold's own key, never
    folded into it.
    """
    holds = await _reserve_all(ledger, scopes, idem_key, tool, estimate, units, hold_ttl_ms)
    try:
        return await run()
    finally:
        if threads is None:
            await carry_through(_settle(ledger, scopes, idem_key, holds, charge))
        elif threads.close_if_idle():
            await carry_through(_settle(ledger, scopes, idem_key, holds, charge, threads))
        else:
            await carry_through(_detach_holds(scopes, holds))
            _detach(
                threads.then(
                    _settle(ledger, scopes, idem_key, holds, charge, threads, outlived=True)
                )
            )


async def _reserve_all(
    ledger: LedgerCore[object],
    scopes: tuple[BudgetScope, ...],
    idem_key: str,
    tool: str,
    estimate: Spend,
    units: frozenset[str],
    ttl_ms: int,
) -> dict[str, str]:
    """A hold on each scope (workflow id -> hold id); ``{}`` for a replay that
    did not fit (it needs no room). Raises ``BudgetExceededError`` (holding
    nothing) when the call does not fit and has not finished."""
    holds: dict[str, str] = {}
    try:
        for scope in scopes:
            await scope.ensure_open()
            hold_id = str(uuid.uuid4())
            # Noted before the step: if this task is cancelled while it runs,
            # the release below gives back whatever it may have reserved.
            holds[scope.workflow_id] = hold_id
            hold = NewHold(hold_id, scope.workflow_id, idem_key, estimate, units, ttl_ms)
            if await scope.store.reserve_budget(hold):
                continue
            if await scope.store.reclaim_holds(scope.workflow_id) and (
                await scope.store.reserve_budget(hold)
            ):
                continue
            del holds[scope.workflow_id]
            found = await _finished(ledger, idem_key)
            # A retryable failure is no replay: the call runs the handler again.
            if found is not None and not found.retryable:
                await _release(scopes, holds)  # a replay: served from its receipt
                return {}
            state = await scope.store.get_budget(scope.workflow_id)
            raise BudgetExceededError(
                scope.workflow_id, tool, _short_units(state, estimate, units), state
            )
    except BaseException:
        await carry_through(_release(scopes, holds))
        raise
    return holds


def _short_units(
    state: BudgetState | None, estimate: Spend, units: frozenset[str]
) -> tuple[str, ...]:
    """The units in which ``estimate`` does not fit ``state`` (for the error message)."""
    if state is None:
        return ()
    limits = state.limits
    limit_of = dict(
        zip(
            UNITS,
            (limits.usd_micros, limits.input_tokens, limits.output_tokens, limits.tool_calls),
            strict=True,
        )
    )
    short = []
    for unit, spent, reserved, est in zip(
        UNITS, state.spent, state.reserved, estimate, strict=True
    ):
        limit = limit_of[unit]
        if (
            unit in units
            and limit is not None
            and (spent + reserved + est > limit or spent + reserved >= limit)
        ):
            short.append("usd" if unit == "usd_micros" else unit)
    return tuple(short)


async def _finished(ledger: LedgerCore[object], idem_key: str) -> Effect | None:
    """The effect if it has finished: in the ledger's store, or inside a replay
    the recorded one that answered the call (a replay books its recorded charge
    on the replay's simulated budgets)."""
    effect = await ledger.find_by_idem_key(idem_key)
    if effect is None and _simulated(ledger) is not None:
        answering = recording()
        assert answering is not None  # _simulated found it
        effect = await answering.recorded(idem_key)
    return effect if effect is not None and effect.status.is_terminal else None


async def _release(scopes: tuple[BudgetScope, ...], holds: dict[str, str]) -> None:
    for scope in scopes:
        hold_id = holds.get(scope.workflow_id)
        if hold_id is not None:
            await scope.store.release_hold(scope.workflow_id, hold_id)


async def _settle(
    ledger: LedgerCore[object],
    scopes: tuple[BudgetScope, ...],
    idem_key: str,
    holds: dict[str, str],
    charge: Callable[[Effect], Spend],
    threads: Threads | None = None,
    *,
    outlived: bool = False,
) -> None:
    """Book the effect's charge if it finished, else give this call's holds back.

    ``threads``: the handler's threads, all ended. Their usage is on the
    receipt when the engine got their answer (the run succeeded or failed:
    the charge is the most of both, as for a deadline, which waits for the
    thread); it is on no receipt when the run ended before they did
    (``outlived``, the caller was cancelled while one ran, its holds
    detached) or was recorded ``canceled`` (a thread that ended just as its
    caller was cancelled): then it is booked beside the effect's charge, on
    each hold's own key (``_book_apart``), and the effect's charge is its
    receipt's.

    A store error here is logged, not raised: the call itself is done, a hold
    left behind is released (or expires), and a charge left unbooked is booked when the
    effect is next called (a replay settles it from its receipt).
    """
    used = Spend() if threads is None else threads.used
    if outlived:
        holds = await _book_apart(scopes, idem_key, holds, used)
    try:
        effect = await _finished(ledger, idem_key)
        if effect is None:
            await _release(scopes, holds)
            return
        amount = charge(effect)
        if not outlived and used != Spend():
            if effect.status is EffectStatus.CANCELED:
                holds = await _book_apart(scopes, idem_key, holds, used)
            else:
                amount = _most(amount, used)
    except Exception:
        logger.exception(
            "could not read effect %s to book its budget charge; its holds are released, "
            "and the charge is booked the next time this call is made",
            idem_key[:12],
        )
        await _release_quietly(scopes, holds)
        return
    for scope in scopes:
        try:
            await scope.store.book_charge(
                scope.workflow_id,
                idem_key=idem_key,
                charge=amount,
                hold_id=holds.get(scope.workflow_id),
                # Holds of the effect made before this run finished are
                # released with it; a rerun's (after a reopen) keep their room.
                finished_at=effect.completed_at,
            )
        except Exception:
            logger.exception(
                "could not book the charge of effect %s on budget %r; its hold is "
                "released, and the charge is booked the next time this call is made",
                idem_key[:12],
                scope.workflow_id,
            )
            await _release_quietly((scope,), holds)


async def _detach_holds(scopes: tuple[BudgetScope, ...], holds: dict[str, str]) -> None:
    """Move this call's holds out of the effect's room (its thread outlives its
    run); a failure is logged: the hold then stays in the effect's room until
    the thread is booked, which still books apart (``_book_apart``)."""

    async def detach(scope: BudgetScope, hold_id: str) -> None:
        await scope.store.detach_hold(scope.workflow_id, hold_id)

    await _each_hold(
        scopes,
        holds,
        detach,
        "could not detach hold {hold} on budget {budget!r} from its effect's room; a rerun "
        "of the effect may share it until this call's thread ends",
    )


async def _book_apart(
    scopes: tuple[BudgetScope, ...], idem_key: str, holds: dict[str, str], used: Spend
) -> dict[str, str]:
    """Book what a thread on no receipt used, added to ``spent`` on each budget
    under its hold's own key (``detached_key``: one charge per hold, so a
    repeat adds nothing), releasing that hold; the holds left (none)."""

    async def book(scope: BudgetScope, hold_id: str) -> None:
        if used == Spend():
            await scope.store.release_hold(scope.workflow_id, hold_id)
        else:
            await scope.store.book_charge(
                scope.workflow_id,
                idem_key=detached_key(idem_key, hold_id),
                charge=used,
                hold_id=hold_id,
            )

    await _each_hold(
        scopes,
        holds,
        book,
        f"could not book what the thread of effect {idem_key[:12]} used on budget "
        "{budget!r}; its hold is released",
        release_on_failure=True,
    )
    return {}


async def _release_quietly(scopes: tuple[BudgetScope, ...], holds: dict[str, str]) -> None:
    """Give this call's holds back after a failed booking; a failure here leaves
    the hold to expire (logged)."""

    async def release(scope: BudgetScope, hold_id: str) -> None:
        await scope.store.release_hold(scope.workflow_id, hold_id)

    await _each_hold(
        scopes,
        holds,
        release,
        "could not release hold {hold} on budget {budget!r}; it expires after its ttl",
    )


async def _each_hold(
    scopes: tuple[BudgetScope, ...],
    holds: dict[str, str],
    step: Callable[[BudgetScope, str], Awaitable[None]],
    failed: str,
    *,
    release_on_failure: bool = False,
) -> None:
    """``step(scope, hold_id)`` for each budget this call holds room on; a failure is
    logged (``failed``, formatted with the ``hold`` and the ``budget``) and the
    others go on; with ``release_on_failure`` that hold is then released."""
    for scope in scopes:
        hold_id = holds.get(scope.workflow_id)
        if hold_id is None:
            continue
        try:
            await step(scope, hold_id)
        except Exception:
            logger.exception(failed.format(hold=hold_id, budget=scope.workflow_id))
            if release_on_failure:
                await _release_quietly((scope,), holds)


def _most(a: Spend, b: Spend) -> Spend:
    return Spend(*(max(x, y) for x, y in zip(a, b, strict=True)))


class Threads:
    """The runs of one call's handler in worker threads (a plain ``call_fn``).

    A thread cannot be stopped: a caller cancelled while its handler's thread
    runs leaves it running, and the provider it called answers (and is paid)
    later. ``gate`` keeps the call's holds (detached from the effect's room)
    until every such thread has ended and books what they used (``used``:
    the most any run reported, unit by unit) beside the effect's charge: it
    is on no receipt. Once the call is settled
    (``close_if_idle``), a thread that had not started yet does not start:
    :meth:`start` says False and the handler calls nobody.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._running = 0
        self._closed = False
        self._waiters: list[asyncio.Future[None]] = []
        #: What the runs that ended reported using.
        self.used = Spend()

    def start(self) -> bool:
        """In the thread, before the handler calls anyone: False when the call
        was settled already (then it must not call)."""
        with self._lock:
            if self._closed:
                return False
            self._running += 1
            return True

    def end(self, used: Spend | None) -> None:
        """In the thread, when the handler is done (``used``: what it reported
        using, None when the provider did not answer)."""
        with self._lock:
            if used is not None:
                self.used = _most(self.used, used)
            self._running -= 1
            idle = self._running == 0
        if idle:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def close_if_idle(self) -> bool:
        """True, and no thread may start from now on, if none is running."""
        with self._lock:
            if self._running == 0:
                self._closed = True
            return self._closed

    async def then(self, work: Coroutine[Any, Any, None]) -> None:
        """Wait until no thread runs (closing), then do ``work``."""
        try:
            while not self.close_if_idle():
                waiter = self._loop.create_future()
                self._waiters.append(waiter)
                if self.close_if_idle():
                    break
                await waiter
        except BaseException:
            work.close()
            raise
        await work


#: Settlings that outlive their caller (``gate`` with threads still running):
#: kept here so that they are not garbage-collected before they end.
_DETACHED: set[asyncio.Task[None]] = set()


def _detach(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.ensure_future(work)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
