"""Logging fields and optional OpenTelemetry spans."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any

import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore, ToolCall, observability


class FakeTracer:
    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, str]]] = []

    @contextmanager
    def start_as_current_span(self, name: str, attributes: dict[str, str]) -> Any:
        self.spans.append((name, attributes))
        yield object()


async def test_run_opens_a_span_when_a_tracer_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """With OpenTelemetry present, each run() is an agent_ledger.run span with the tool and key."""
    tracer = FakeTracer()
    monkeypatch.setattr(observability, "_tracer", tracer)
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    call = ToolCall(workflow_id="w", tool="t")
    await ledger.run(call, lambda e: 1)
    assert tracer.spans == [
        (
            "agent_ledger.run",
            {"agent_ledger.tool": "t", "agent_ledger.idem_key": ledger.idem_key(call)},
        )
    ]


def test_span_is_a_no_op_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a tracer, span() costs a nullcontext and nothing else."""
    monkeypatch.setattr(observability, "_tracer", None)
    with observability.span("x", "tool", "key") as value:
        assert value is None


async def test_log_records_carry_the_effect_fields(caplog: pytest.LogCaptureFixture) -> None:
    """Records under the agent_ledger logger name the effect, key, tool and workflow."""
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    call = ToolCall(workflow_id="wf-9", tool="email.send")
    with caplog.at_level(logging.DEBUG, logger="agent_ledger"):
        await ledger.run(call, lambda e: 1)
    record = next(r for r in caplog.records if r.getMessage().startswith("effect created"))
    assert record.idem_key == ledger.idem_key(call)  # type: ignore[attr-defined]
    assert record.workflow_id == "wf-9" and record.tool == "email.send"  # type: ignore[attr-defined]
    assert record.effect_id  # type: ignore[attr-defined]
