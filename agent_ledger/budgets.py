"""Spend budgets: the limits a workflow may not go past, and what it has spent.

A value module: ``Budget`` is what a caller attaches to a workflow
(``ledger.workflow(id, budget=Budget(usd=2.0))``); ``Spend`` is an amount in
the four units a budget counts; ``BudgetState`` is a budget as a store keeps
it. The enforcement (reserve before a call, book after it) lives above the
engine, in ``agent_ledger.tools``; the atomic steps in the stores
(``stores/budget_base.py``).

Dollars are kept as integer millionths (``usd_micros``) everywhere below the
caller: sums of floats drift (0.1 added ten times is not 1.0), and a limit
check must never depend on the order calls were booked in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Final, NamedTuple

from agent_ledger.errors import EffectLedgerValidationError

__all__ = ["USD_MICROS", "Budget", "BudgetState", "Spend", "usd_to_micros"]

#: Millionths of a dollar in one dollar: the unit budgets count money in.
USD_MICROS: Final = 1_000_000
#: The largest amount any budget counter may hold (PostgreSQL's bigint).
_MAX_COUNT: Final = 2**63 - 1


def usd_to_micros(usd: float, *, field: str = "usd") -> int:
    """``usd`` dollars as whole millionths (rounded to the nearest), checked."""
    if type(usd) not in (int, float) or not math.isfinite(usd) or usd < 0:
        raise EffectLedgerValidationError(
            f"{field} must be a finite number of US dollars >= 0, got {usd!r}", field=field
        )
    micros = round(usd * USD_MICROS)
    if micros > _MAX_COUNT:
        raise EffectLedgerValidationError(f"{field} is too large: {usd!r}", field=field)
    return micros


def _count(value: object, field: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_COUNT:
        raise EffectLedgerValidationError(
            f"{field} must be an int >= 0, got {value!r}", field=field
        )
    return value


@dataclass(frozen=True, slots=True)
class Budget:
    """The most a workflow may spend; None leaves that unit unlimited.

    ``usd`` is checked against the prices the pricing callback gives model
    calls (``ledger.llm(..., pricing=...)``); ``input_tokens`` and
    ``output_tokens`` against the tokens their responses report;
    ``tool_calls`` against the tool calls that execute (replays and
    compensations are not counted). A budget is stored under its workflow
    id the first time it is used, and every worker, process and restart
    shares it from then on; attaching a *different* budget to that id later
    raises ``BudgetMismatchError``.

    >>> Budget(usd=1.0, tool_calls=20)
    Budget(usd=1.0, input_tokens=None, output_tokens=None, tool_calls=20)
    """

    usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    tool_calls: int | None = None

    def __post_init__(self) -> None:
        if self.usd is not None:
            usd_to_micros(self.usd, field="usd")  # the check; kept as given
        for name in ("input_tokens", "output_tokens", "tool_calls"):
            value = getattr(self, name)
            if value is not None:
                _count(value, name)

    @property
    def usd_micros(self) -> int | None:
        return None if self.usd is None else usd_to_micros(self.usd)

    def same_limits(self, other: Budget) -> bool:
        """Whether ``other`` limits the same things by the same amounts (dollars to
        the millionth, as stored)."""
        return (
            self.usd_micros == other.usd_micros
            and self.input_tokens == other.input_tokens
            and self.output_tokens == other.output_tokens
            and self.tool_calls == other.tool_calls
        )


class Spend(NamedTuple):
    """An amount in the units a budget counts: spent, reserved, an estimate, a charge."""

    usd_micros: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0

    @property
    def usd(self) -> float:
        return self.usd_micros / USD_MICROS

    def to_json(self) -> dict[str, float | int]:
        return {
            "usd": self.usd,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tool_calls": self.tool_calls,
        }


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget as stored: its limits, what was booked, what calls in flight hold.

    ``spent`` is the sum of every booked charge (one per effect); ``reserved``
    the estimates of calls that have reserved and not yet been booked or
    released (a call that crashed in between holds its estimate until its
    hold expires, or until its effect is next seen finished).
    """

    workflow_id: str
    limits: Budget
    spent: Spend
    reserved: Spend
    #: How many holds are open (reserved and not yet booked, released or expired).
    holds: int
    created_at: datetime
    updated_at: datetime

    def remaining(self) -> dict[str, float | int | None]:
        """What may still be reserved in each unit (None: unlimited); never below 0."""
        limits, spent, reserved = self.limits, self.spent, self.reserved
        usd = limits.usd_micros
        return {
            "usd": None
            if usd is None
            else max(usd - spent.usd_micros - reserved.usd_micros, 0) / USD_MICROS,
            "input_tokens": _left(limits.input_tokens, spent.input_tokens, reserved.input_tokens),
            "output_tokens": _left(
                limits.output_tokens, spent.output_tokens, reserved.output_tokens
            ),
            "tool_calls": _left(limits.tool_calls, spent.tool_calls, reserved.tool_calls),
        }

    def to_json(self) -> dict[str, object]:
        """The ``agent-ledger budget show --json`` form."""
        limits = self.limits
        return {
            "workflow_id": self.workflow_id,
            "limits": {
                "usd": limits.usd,
                "input_tokens": limits.input_tokens,
                "output_tokens": limits.output_tokens,
                "tool_calls": limits.tool_calls,
            },
            "spent": self.spent.to_json(),
            "reserved": self.reserved.to_json(),
            "remaining": self.remaining(),
            "open_holds": self.holds,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


def _left(limit: int | None, spent: int, reserved: int) -> int | None:
    return None if limit is None else max(limit - spent - reserved, 0)
