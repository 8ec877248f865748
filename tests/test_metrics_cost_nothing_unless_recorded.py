"""Metrics (and spans) cost nothing without OpenTelemetry, and next to nothing with the
API but no provider: no import attempt after the first, no provider lookup per call."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import orjson
import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerOptions,
    MemoryStore,
    ToolCall,
    metrics,
)
from agent_ledger import observability as spans
from agent_ledger.approvals import Channel, DecisionAction
from agent_ledger.deciding import decide
from agent_ledger.options import RunOptions

# A scenario that reaches every counting site on the common paths: fresh runs,
# replays, an approval asked, decided from the console, a refused second click,
# a cancel.
_SCENARIO = textwrap.dedent(
    """
    import asyncio
    from agent_ledger import ApprovalPendingError, EffectLedger, EffectLedgerOptions
    from agent_ledger import MemoryStore, RunOptions, ToolCall
    from agent_ledger.approvals import Channel, DecisionAction
    from agent_ledger.deciding import decide, effect_intent

    async def scenario():
        store = MemoryStore()
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        for n in range(20):
            call = ToolCall(workflow_id="w", tool="t", args={"n": n})
            await ledger.run(call, lambda e: n)
            await ledger.run(call, lambda e: n)
        ask = RunOptions(requires_approval=True, wait_for_approval=False)
        for tool in ("pay", "sms"):
            try:
                await ledger.run(ToolCall(workflow_id="w", tool=tool), lambda e: 1, ask)
            except ApprovalPendingError as exc:
                waiting = exc.effect
            if tool == "pay":
                for _ in range(2):
                    await decide(store, waiting.idem_key, action=DecisionAction.APPROVE,
                                 principal="ana", channel=Channel.CONSOLE,
                                 shown_intent=effect_intent(waiting, None))
            else:
                assert await ledger.cancel(waiting.idem_key, reason="no", by="ana")
    """
)

_WITHOUT_THE_API = (
    textwrap.dedent(
        """
    import asyncio, sys, orjson

    class NotInstalled:
        attempts = []
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                NotInstalled.attempts.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from agent_ledger import metrics, observability
    at_import = list(NotInstalled.attempts)
    """
    )
    + _SCENARIO
    + textwrap.dedent(
        """
    asyncio.run(scenario())
    try:
        metrics.set_meter_provider(object())
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    print(orjson.dumps({
        "at_import": at_import,
        "after": NotInstalled.attempts[len(at_import):],
        "loaded": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
        "recording": metrics.recording(),
        "span_is_shared_no_op": observability.span("x", "t", "k") is observability._NO_SPAN,
        "refused": refused,
    }).decode())
    """
    )
)


def _run(script: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = orjson.loads(done.stdout)
    return out


def test_without_opentelemetry_nothing_is_imported_after_the_first_try() -> None:
    """The API missing (a meta-path finder refuses it): importing agent_ledger tries
    ``opentelemetry`` once per module that might use it, and running, replaying and
    deciding never try again; no OpenTelemetry module is loaded, nothing records."""
    out = _run(_WITHOUT_THE_API)
    assert out["at_import"] == ["opentelemetry", "opentelemetry"]  # spans, then metrics
    assert out["after"] == []
    assert out["loaded"] == []
    assert out["recording"] is False
    assert out["span_is_shared_no_op"] is True
    assert out["refused"] == "agent_ledger.metrics needs opentelemetry-api: pip install it"


class _NoLookups:
    """Stands in for ``get_meter_provider`` / ``get_tracer_provider``: fails the test if called."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        raise AssertionError(f"{self.name}() called on the hot path")


async def test_with_the_api_and_no_provider_nothing_looks_the_provider_up_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the API installed and no provider set (this test process), runs, replays
    and decisions never call ``get_meter_provider()`` or ``get_tracer_provider()``
    (each also reads an environment variable), create no instrument and start no
    span."""
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace

    assert metrics._globals is not None and spans._PEEK  # the fast path, on this API
    assert otel_metrics.get_meter_provider().__class__.__name__ == "_ProxyMeterProvider"
    meter_lookup = _NoLookups("get_meter_provider")
    tracer_lookup = _NoLookups("get_tracer_provider")
    monkeypatch.setattr(otel_metrics, "get_meter_provider", meter_lookup)
    monkeypatch.setattr(otel_trace, "get_tracer_provider", tracer_lookup)
    store = MemoryStore()
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    for n in range(20):
        call = ToolCall(workflow_id="w", tool="t", args={"n": n})
        assert await ledger.run(call, lambda e: 1) == 1
        assert await ledger.run(call, lambda e: 2) == 1
    ask = RunOptions(requires_approval=True, wait_for_approval=False)
    with pytest.raises(ApprovalPendingError) as asked:
        await ledger.run(ToolCall(workflow_id="w", tool="pay"), lambda e: 1, ask)
    for _ in range(2):
        await decide(
            store,
            asked.value.idem_key,
            action=DecisionAction.APPROVE,
            principal="ana",
            channel=Channel.CODE,
            shown_intent=None,
        )
    assert (meter_lookup.calls, tracer_lookup.calls) == (0, 0)
    assert metrics._bound is None
    assert spans.span("agent_ledger.run", "t", "k") is spans._NO_SPAN


_SET_AFTER_IMPORT = (
    "import asyncio, orjson\n"
    + _SCENARIO
    + textwrap.dedent(
        """
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    asyncio.run(scenario())  # before any provider: nothing recorded anywhere
    reader = InMemoryMetricReader()
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    asyncio.run(scenario())  # from now on, counted
    seen = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    attrs = ",".join(f"{k}={v}" for k, v in sorted(p.attributes.items()))
                    value = p.count if hasattr(p, "bucket_counts") else p.value
                    seen[f"{m.name}[{attrs}]"] = value
    print(orjson.dumps(seen).decode())
    """
    )
)


def test_a_global_meter_provider_set_after_import_counts_from_then_on() -> None:
    """The application sets its provider after agent_ledger was imported and used:
    events count from that moment, none from before."""
    tool, channel = "agent_ledger.tool", "agent_ledger.decision.channel"
    action, reason = "agent_ledger.decision.action", "agent_ledger.decision.reason"
    wait, outcome = "agent_ledger.approval.wait.duration", "agent_ledger.approval.outcome"
    assert _run(_SET_AFTER_IMPORT) == {
        f"agent_ledger.executions[{tool}=t]": 20,
        f"agent_ledger.replays[{tool}=t]": 20,
        f"agent_ledger.decisions[{action}=approve,{channel}=console,{tool}=pay]": 1,
        f"agent_ledger.refused_decisions[{action}=approve,{channel}=console,"
        f"{reason}=already_decided]": 1,
        f"agent_ledger.approval.pending[{tool}=pay]": 0,
        f"agent_ledger.approval.pending[{tool}=sms]": 0,
        f"{wait}[{outcome}=approved,{tool}=pay]": 1,
        f"{wait}[{outcome}=canceled,{tool}=sms]": 1,
    }
