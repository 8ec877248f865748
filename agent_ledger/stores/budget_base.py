"""What a store keeps for spend budgets, and the small Protocol through which it keeps it.

A budget is one row per workflow id: its limits, what was booked (``spent``)
and what calls in flight hold (``reserved``). Beside it, a *hold* per call
that reserved and has not been settled (its estimate, the effect it is for,
and when it expires), and a *charge* per effect that was booked (its
amounts). The rules the layer above builds on:

* **Reserve** is one atomic conditional step: the estimate is added to
  ``reserved`` and its hold recorded only if, in every unit the call counts
  in, ``spent + reserved + estimate <= limit`` and ``spent + reserved < limit``
  (so a call estimated at 0 still stops at an exhausted limit). Concurrent
  reservations serialize on the budget row: two callers can never both take
  the last room.
* **An effect holds room once, shared by its callers.** Every caller of an
  effect (the one that runs it, a second caller waiting for its outcome, a
  worker taking it over) records its own hold, but the room the effect takes
  (what counts in ``reserved``) is the *largest* estimate among its live
  holds, unit by unit. A caller that finds live holds of the same effect
  joins them: its reservation adds only what its estimate grows the room by
  (nothing when it is no larger, and then it always fits: the call was
  admitted when the first hold was made), and never lowers it. A caller
  that leaves releases only its own hold: the effect's room shrinks to the
  largest estimate among the holds left, so a waiter that gives up takes
  nothing from the call still running. Expired holds of the effect (a dead
  worker's) are dropped by the reservation and not counted against it.
  ``BudgetState.holds`` counts effects holding room, not hold rows.
* **Book** keeps one charge per (budget, idem key), which only grows: a
  booking raises it to the receipt, unit by unit, and adds what it grew by
  to ``spent`` (however many workers or replays book the same receipt, it
  is counted once; a reopened effect that ran again adds its difference).
  It releases, in one step, the caller's hold and the other holds for that
  effect made *strictly before* the booked run finished (``finished_at``,
  the effect's ``completed_at``, on the store's clock like the holds'
  creation times): their run has finished, nobody needs room for it any
  more. A hold made at that instant or later is kept: it may be a rerun's
  (the effect was reopened and runs again), and a late booking of the
  previous run must not give its room away. Such a hold is released by its
  own caller (or expires); when in doubt, a hold keeps its room. Without
  ``finished_at`` only the caller's hold is released.
* **Detach** moves one hold out of its effect's room into a room of its own
  (idem key ``<key>#thread:<hold_id>``, ``detached_key``): the caller's run
  ended while its handler's thread still runs (a plain ``call_fn`` whose
  caller was cancelled), so the thread spends on its own, beside any later
  run of the effect, which must find room of its own. ``reserved`` grows by
  what the two rooms now take apart (possibly past the limit: the thread
  is running already; later calls are refused until it is booked). When
  the thread ends, its usage is booked *additively* under that key (one
  charge per hold: idempotent), never folded into the effect's charge.
* **Release** gives a hold's estimate back without booking anything (the call
  never reached its handler, or its outcome is not known yet).
* **Hold times** (``ttl_ms``) are ints from 1 to ``MAX_HOLD_TTL_MS`` (7
  days) on every store (``check_hold``), checked before anything is stored.
* **Reclaim** gives back the holds that expired (their caller crashed between
  reserving and booking, or was cut off), so a lost hold never keeps its
  room for ever.

Kept apart from :class:`~agent_ledger.stores.base.Store`, as sagas are
(``saga_base.py``): a store that keeps budgets implements both. Each method is
one atomic step; times use the store's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

from agent_ledger.budgets import USD_MICROS, Budget, BudgetState, Spend
from agent_ledger.errors import EffectLedgerValidationError

#: The units a budget counts, in the order every row and parameter lists them.
UNITS: Final = ("usd_micros", "input_tokens", "output_tokens", "tool_calls")
#: The most budgets one ``list_budgets`` call returns.
MAX_BUDGET_PAGE: Final = 1_000
#: The longest a hold may keep its room without being settled: 7 days, in ms
#: (far past any call, and well inside every store's clock).
MAX_HOLD_TTL_MS: Final = 7 * 24 * 60 * 60 * 1000


class NewHold(NamedTuple):
    """What ``reserve_budget`` records when the estimate fits."""

    #: Chosen by the caller (a UUID) before the step, so a caller cut off
    #: mid-step can still release what it may have reserved.
    hold_id: str
    workflow_id: str
    #: The effect the hold is for; booking that effect releases it.
    idem_key: str
    estimate: Spend
    #: The units this call counts in (a subset of ``UNITS``): only their limits are checked.
    units: frozenset[str]
    #: How long the hold keeps its room if nobody books or releases it, in ms.
    ttl_ms: int


@runtime_checkable
class BudgetStore(Protocol):
    """Where budgets live; see the module doc for the shared rules."""

    async def open_budget(self, workflow_id: str, limits: Budget) -> BudgetState:
        """Insert-or-get: a new id is stored with ``limits`` and nothing spent;
        an existing one is returned as stored, unchanged (the caller compares
        the limits). Of concurrent opens exactly one inserts."""
        ...

    async def reserve_budget(self, hold: NewHold) -> bool:
        """Record the hold, joining the effect's live holds (``reserved`` grows
        by what it grows the effect's room by, module doc) and dropping its
        expired ones, if it fits, in one atomic step. True if it did; False,
        changing nothing, if it does not fit or the budget does not exist.
        ``EffectLedgerValidationError`` (``check_hold``) before anything."""
        ...

    async def book_charge(
        self,
        workflow_id: str,
        *,
        idem_key: str,
        charge: Spend,
        hold_id: str | None,
        finished_at: datetime | None = None,
    ) -> bool:
        """Raise the effect's recorded charge to ``charge`` (unit by unit, never
        lower), add what it grew by to ``spent``, and delete the hold
        ``hold_id`` and every other hold for ``idem_key`` made strictly before
        ``finished_at`` (none without it; the effect's room shrinking to the
        largest estimate among its holds left), in one atomic step. True if
        this call recorded the charge first or raised it."""
        ...

    async def detach_hold(self, workflow_id: str, hold_id: str) -> bool:
        """Move the hold out of its effect's room into a room of its own (idem
        key ``detached_key(key, hold_id)``), in one atomic step: the effect's
        room shrinks to the largest estimate among its holds left, ``reserved``
        grows by the hold's estimate (never refused: module doc). True if it
        was there and not detached already."""
        ...

    async def release_hold(self, workflow_id: str, hold_id: str) -> bool:
        """Delete the hold; its effect's room shrinks to the largest estimate
        among the holds left for it (module doc). True if it was there."""
        ...

    async def reclaim_holds(self, workflow_id: str) -> int:
        """Delete the budget's expired holds (each effect's room shrinking as
        for ``release_hold``); how many. Concurrent reclaims give each hold back once."""
        ...

    async def get_budget(self, workflow_id: str) -> BudgetState | None: ...

    async def list_budgets(self, *, limit: int = 100) -> list[BudgetState]:
        """Up to ``limit`` budgets, most recently changed first."""
        ...


#: What ``detached_key`` puts between an effect's idem key and the hold id.
DETACHED: Final = "#thread:"


def detached_key(idem_key: str, hold_id: str) -> str:
    """The idem key of a detached hold's own room (and of its thread's charge)."""
    return f"{idem_key}{DETACHED}{hold_id}"


def check_budget_limit(limit: object) -> int:
    """``limit`` for ``list_budgets``, checked the same way for every store."""
    if type(limit) is not int or not 1 <= limit <= MAX_BUDGET_PAGE:
        raise EffectLedgerValidationError(
            f"limit must be an int from 1 to {MAX_BUDGET_PAGE}, got {limit!r}", field="limit"
        )
    return limit


def check_hold_ttl_ms(ttl_ms: object) -> int:
    """A hold's ``ttl_ms``, checked the same way for every store and by ``ledger.llm``."""
    if type(ttl_ms) is not int or not 1 <= ttl_ms <= MAX_HOLD_TTL_MS:
        raise EffectLedgerValidationError(
            f"hold_ttl_ms must be an int from 1 to {MAX_HOLD_TTL_MS:_} (7 days), got "
            f"{ttl_ms!r}. Nothing was stored.",
            field="hold_ttl_ms",
        )
    return ttl_ms


def check_hold(hold: NewHold) -> NewHold:
    """What every store checks of a ``NewHold`` before it changes anything."""
    check_hold_ttl_ms(hold.ttl_ms)
    return hold


def limit_params(limits: Budget) -> dict[str, int | None]:
    """The stored limits: one nullable integer per unit (dollars in millionths)."""
    return {
        "limit_usd_micros": limits.usd_micros,
        "limit_input_tokens": limits.input_tokens,
        "limit_output_tokens": limits.output_tokens,
        "limit_tool_calls": limits.tool_calls,
    }


def estimate_params(hold: NewHold) -> dict[str, int | None]:
    """``est_<unit>``: the estimate in each unit the call counts in, NULL in the others
    (a NULL estimate is never checked against its limit)."""
    return {
        f"est_{unit}": (amount if unit in hold.units else None)
        for unit, amount in zip(UNITS, hold.estimate, strict=True)
    }


def amount_params(prefix: str, amount: Spend) -> dict[str, int]:
    return {f"{prefix}_{unit}": value for unit, value in zip(UNITS, amount, strict=True)}


def fits(
    limits: Sequence[int | None],
    spent: Sequence[int],
    reserved: Sequence[int],
    estimate: Sequence[int | None],
) -> bool:
    """The reservation rule in Python (MemoryStore; the SQL stores say it in SQL)."""
    for limit, used, held, est in zip(limits, spent, reserved, estimate, strict=True):
        if limit is None or est is None:
            continue
        if used + held + est > limit or used + held >= limit:
            return False
    return True


def joined_room(
    limits: Sequence[int | None],
    spent: Spend,
    reserved: Spend,
    old: Spend,
    live: Sequence[Spend],
    hold: NewHold,
) -> Spend | None:
    """The effect's room once ``hold`` joins its ``live`` holds' estimates, or
    None if it does not fit (the stores that reserve in Python: memory, SQLite,
    MySQL). ``old`` is the room the effect's holds take now, expired ones
    included; the budget's ``reserved`` loses ``old`` and gains the answer.

    Only the units ``hold`` counts are checked. Joining a live hold at no more
    than it holds always fits: the call was admitted when that hold was made.
    """
    new = largest_spend([*live, hold.estimate])
    counted = [unit in hold.units for unit in UNITS]
    grows = any(c and n > o for c, n, o in zip(counted, new, old, strict=True))
    if (grows or not live) and not fits(
        limits,
        spent,
        spend_minus(reserved, old),
        [n if c else None for c, n in zip(counted, new, strict=True)],
    ):
        return None
    return new


#: The budget columns every SQL store selects, in the order ``budget_from_row`` reads them.
BUDGET_ROW: Final = (
    "workflow_id",
    *(f"limit_{u}" for u in UNITS),
    *(f"spent_{u}" for u in UNITS),
    *(f"reserved_{u}" for u in UNITS),
    "holds", "created", "updated",
)  # fmt: skip


def budget_from_row(row: Sequence[Any], when: Callable[[Any], datetime]) -> BudgetState:
    """A ``BudgetState`` from a row in ``BUDGET_ROW`` order; ``when`` reads a stored time."""
    workflow_id = row[0]
    limit_usd, limit_in, limit_out, limit_calls = row[1:5]
    spent = Spend(*(int(v) for v in row[5:9]))
    reserved = Spend(*(int(v) for v in row[9:13]))
    holds, created, updated = row[13:16]
    limits = Budget(
        usd=None if limit_usd is None else int(limit_usd) / USD_MICROS,
        input_tokens=None if limit_in is None else int(limit_in),
        output_tokens=None if limit_out is None else int(limit_out),
        tool_calls=None if limit_calls is None else int(limit_calls),
    )
    return BudgetState(
        workflow_id=workflow_id,
        limits=limits,
        spent=spent,
        reserved=reserved,
        holds=int(holds),
        created_at=when(created),
        updated_at=when(updated),
    )


def limit_values(state: BudgetState) -> tuple[int | None, ...]:
    """A budget's limits in ``limit_params`` order, to compare a stored row with a request."""
    limits = state.limits
    return (limits.usd_micros, limits.input_tokens, limits.output_tokens, limits.tool_calls)


def hold_amount(row: Sequence[Any]) -> Spend:
    """The estimate of a ``HOLD_ROWS`` row (the SQL dialects' hold reads)."""
    return Spend(*(int(v) for v in row[2:6]))


def largest_spend(amounts: Iterable[Spend]) -> Spend:
    """The room a group of holds of one effect takes: their largest estimate, unit by unit."""
    room = Spend()
    for amount in amounts:
        room = Spend(*(max(a, b) for a, b in zip(room, amount, strict=True)))
    return room


def spend_minus(a: Spend, b: Spend) -> Spend:
    """``a - b``, unit by unit (may go negative: the caller decides what that means)."""
    return Spend(*(x - y for x, y in zip(a, b, strict=True)))


def room_freed(group: Sequence[Sequence[Any]], leaving: Container[str]) -> Spend:
    """How much an effect's room shrinks when the holds ``leaving`` (hold ids)
    leave its ``group`` (``HOLD_ROWS`` rows, the SQL dialects' hold reads): the
    largest estimate of them all, less the largest of those left."""
    old = largest_spend(hold_amount(row) for row in group)
    left = largest_spend(hold_amount(row) for row in group if row[0] not in leaving)
    return spend_minus(old, left)
