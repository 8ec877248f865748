"""Logging fields and optional OpenTelemetry spans."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import orjson
import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore, ToolCall, observability

# Run in a child: a tracer provider can be set once per process, and one set
# here would make every other test trace.
_TRACED_RUN = textwrap.dedent(
    """
    import asyncio, orjson
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore, ToolCall

    async def main():
        ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
        call = ToolCall(workflow_id="w", tool="t")
        seen = []
        await ledger.run(call, lambda e: seen.append(trace.get_current_span().is_recording()))
        # Set after the ledger was imported and used: spans start from now on.
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        await ledger.run(call, lambda e: None)  # a replay
        other = ToolCall(workflow_id="w", tool="u")
        await ledger.run(other, lambda e: seen.append(trace.get_current_span().is_recording()))
        spans = [(s.name, dict(s.attributes)) for s in exporter.get_finished_spans()]
        print(orjson.dumps({"spans": spans, "seen": seen, "keys": [
            ledger.idem_key(call), ledger.idem_key(other)]}).decode())

    asyncio.run(main())
    """
)


def test_run_is_a_span_once_a_tracer_provider_is_set() -> None:
    """Each run() is an agent_ledger.run span naming the tool and key, current
    while the handler runs, from the moment the application sets a provider."""
    done = subprocess.run(
        [sys.executable, "-c", _TRACED_RUN], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout)
    first, second = out["keys"]
    assert out["spans"] == [
        ["agent_ledger.run", {"agent_ledger.tool": "t", "agent_ledger.idem_key": first}],
        ["agent_ledger.run", {"agent_ledger.tool": "u", "agent_ledger.idem_key": second}],
    ]
    # Before the provider: nothing recording; after it: the handler runs in our span.
    assert out["seen"] == [False, True]


def test_no_span_while_no_tracer_provider_is_set() -> None:
    """With the API installed but no provider set (this test process), span()
    is the shared no-op context: nothing is allocated per run."""
    assert observability._trace is not None  # the dev install has the API
    assert observability.span("x", "tool", "key") is observability._NO_SPAN


def test_span_is_a_no_op_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the API, span() costs a nullcontext and nothing else."""
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


def test_span_does_not_look_the_tracer_provider_up_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the API and no provider set, span() reads the API's provider variable,
    as its proxy tracer does, and never calls get_tracer_provider(), which reads an
    environment variable on every call."""
    from opentelemetry import trace

    calls: list[None] = []
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: calls.append(None))
    assert observability._PEEK
    for _ in range(100):
        assert observability.span("x", "tool", "key") is observability._NO_SPAN
    assert calls == []
