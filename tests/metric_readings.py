"""Reading the ledger's OpenTelemetry metrics in tests: an SDK ``MeterProvider`` with an
``InMemoryMetricReader``, given to ``agent_ledger.metrics`` (never set globally, so no
other test records anything)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)

from agent_ledger import metrics

#: A series: its attributes as sorted (key, value) pairs.
Series = tuple[tuple[str, str], ...]


def series(**attributes: str) -> Series:
    """``series(tool="pay")`` for ``{"agent_ledger.tool": "pay"}``; the decision keys
    are ``channel``, ``action``, ``reason``; the wait's ``outcome``."""
    keys = {
        "tool": metrics.TOOL,
        "channel": metrics.CHANNEL,
        "action": metrics.ACTION,
        "reason": metrics.REASON,
        "outcome": metrics.OUTCOME,
    }
    return tuple(sorted((keys[k], v) for k, v in attributes.items()))


@dataclass(frozen=True)
class Histogram:
    count: int
    sum: float


class Readings:
    """What the reader collected, by instrument name and series."""

    def __init__(self, reader: InMemoryMetricReader, provider: MeterProvider) -> None:
        self._reader = reader
        #: The provider the ledger records on.
        self.provider = provider

    def collect(self) -> dict[str, dict[Series, Any]]:
        data = self._reader.get_metrics_data()
        out: dict[str, dict[Series, Any]] = {}
        if data is None:
            return out
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                assert scope.scope.name == "agent_ledger"
                for metric in scope.metrics:
                    points = out.setdefault(metric.name, {})
                    for point in metric.data.data_points:
                        attributes = point.attributes or {}
                        key = tuple(sorted((k, str(v)) for k, v in attributes.items()))
                        if isinstance(point, HistogramDataPoint):
                            points[key] = Histogram(point.count, point.sum)
                        else:
                            assert isinstance(point, NumberDataPoint)
                            points[key] = point.value
        return out

    def values(self, name: str) -> dict[Series, Any]:
        """One instrument's series, without those at 0 (an up-down counter keeps them)."""
        return {k: v for k, v in self.collect().get(name, {}).items() if v != 0}

    def unit(self, name: str) -> str:
        data = self._reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        return str(metric.unit)
        raise AssertionError(f"{name} was not recorded")


@pytest.fixture
def readings() -> Iterator[Readings]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    try:
        yield Readings(reader, provider)
    finally:
        metrics.set_meter_provider(None)
        provider.shutdown()
