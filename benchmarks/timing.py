"""Repetitions and the two numbers every figure reports: median and p95."""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """A measured quantity: the median of its samples, their p95, and the unit."""

    median: float
    p95: float
    unit: str
    samples: int

    def as_dict(self) -> dict[str, float | str | int]:
        return {"median": self.median, "p95": self.p95, "unit": self.unit, "samples": self.samples}


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation: a real observed value)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def figure(values: Sequence[float], unit: str) -> Figure:
    return Figure(statistics.median(values), percentile(values, 0.95), unit, len(values))


async def repeat(repetitions: int, measure: Callable[[int], Awaitable[float]]) -> list[float]:
    """Run ``measure(rep)`` ``repetitions`` times after one unrecorded warm-up."""
    await measure(-1)
    return [await measure(rep) for rep in range(repetitions)]
