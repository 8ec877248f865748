"""The deadline's options and words: RunOptions(timeout_ms=...), a tool's timeout_ms=,
the recorded messages and what a model reads."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from agent_ledger import (
    Effect,
    EffectError,
    EffectLedgerValidationError,
    EffectStatus,
    MemoryStore,
    RetryPolicy,
    RunOptions,
    ToolCall,
)
from agent_ledger.adapters._messages import for_model
from agent_ledger.backoff import MAX_MS
from agent_ledger.engine.deadline import Late, late_outcome
from agent_ledger.errors import HandlerTimeoutError
from agent_ledger.options import (
    MAX_LEASE_MS,
    ConcurrencyOptions,
    StaleOptions,
    merge_run_options,
    resolve,
)
from agent_ledger.testing import build_ledger

NOW = datetime(2026, 1, 1, tzinfo=UTC)
EFFECT = Effect(
    id="00000000-0000-4000-8000-000000000001",
    idem_key="ab" * 32,
    workflow_id="wf",
    call_id=None,
    tool="psp.charge",
    status=EffectStatus.PROCESSING,
    args_canonical="{}",
    resource_id_canonical=None,
    result=None,
    error=None,
    dedup_count=0,
    attempt=1,
    created_at=NOW,
    updated_at=NOW,
    completed_at=None,
    heartbeat_at=NOW,
)


@pytest.mark.parametrize("bad", [0, -5, 1.5, "100", True])
def test_timeout_ms_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(EffectLedgerValidationError, match="timeout_ms") as info:
        RunOptions(timeout_ms=bad)  # type: ignore[arg-type]
    assert info.value.field == "timeout_ms"


def test_timeout_ms_merges_like_every_option() -> None:
    base = RunOptions(timeout_ms=500)
    assert resolve(merge_run_options(base, RunOptions())).timeout_ms == 500
    assert resolve(merge_run_options(base, RunOptions(timeout_ms=80))).timeout_ms == 80
    assert resolve(merge_run_options(base, RunOptions(timeout_ms=None))).timeout_ms is None
    assert resolve(RunOptions()).timeout_ms is None


async def test_a_tools_timeout_ms_is_its_deadline() -> None:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("slow.tool", timeout_ms=50)
    async def slow(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    with ledger.workflow("wf"), pytest.raises(HandlerTimeoutError) as info:
        await slow(60)
    assert info.value.limit_ms == 50
    # A call's own run_options go over the tool's: None turns the deadline off.
    with ledger.workflow("wf"):
        assert await slow.invoke({"seconds": 0.2}, run_options=RunOptions(timeout_ms=None)) == 0.2


def test_a_tools_timeout_ms_given_twice_is_refused() -> None:
    ledger = build_ledger(MemoryStore())
    with pytest.raises(EffectLedgerValidationError, match="given twice") as info:
        ledger.tool("t", timeout_ms=5, run_options=RunOptions(timeout_ms=9))
    assert info.value.field == "timeout_ms"
    with pytest.raises(EffectLedgerValidationError, match="timeout_ms must be > 0"):
        ledger.tool("t", timeout_ms=0)


@pytest.mark.parametrize(
    ("late", "status"),
    [
        (Late(123.4, cancelled=True), EffectStatus.CANCELED),
        (Late(123.4, cancelled=True, exc=OSError("after 5 ms")), EffectStatus.CANCELED),
        (Late(123.4, cancelled=False, value={"a": 1}), EffectStatus.FAILED),
        (Late(123.4, cancelled=False, exc=ValueError("x")), EffectStatus.FAILED),
        (Late(123.4, cancelled=False, value=1, ignored_cancel=True), EffectStatus.FAILED),
    ],
)
def test_every_record_of_a_breach_gives_back_its_numbers(late: Late, status: EffectStatus) -> None:
    """A replay builds HandlerTimeoutError from the record alone: limit and run time too."""
    recorded_status, result_json, error = late_outcome(late, 100)
    assert recorded_status is status and error.code == "handler_timeout"
    assert (result_json is not None) == (late.value is not None and late.exc is None)
    effect = dataclasses.replace(EFFECT, status=recorded_status, error=error)
    raised = HandlerTimeoutError(effect)
    assert (raised.limit_ms, raised.ran_ms, raised.waited_ms) == (100, 123.0, 123.0)
    assert raised.status is status


def test_a_late_result_that_is_not_json_is_said_so() -> None:
    _, result_json, error = late_outcome(Late(70.0, cancelled=False, value=object()), 50)
    assert result_json is None and "could not be kept" in error.message


def test_what_a_model_reads_about_a_handler_timeout() -> None:
    error = EffectError(late_outcome(Late(80.0, cancelled=True), 50)[2].message, "handler_timeout")
    text = for_model(HandlerTimeoutError(dataclasses.replace(EFFECT, error=error)))
    assert text is not None
    assert "time limit (50 ms" in text and "will not run again" in text
    assert "still being run" not in text  # not a wait's words


#: Every option in milliseconds, built with ``value``.
MS_OPTIONS: list[tuple[str, Callable[[int], object]]] = [
    ("timeout_ms", lambda v: RunOptions(timeout_ms=v)),
    ("wait_timeout_ms", lambda v: ConcurrencyOptions(wait_timeout_ms=v)),
    ("approval_timeout_ms", lambda v: ConcurrencyOptions(approval_timeout_ms=v)),
    ("initial_interval_ms", lambda v: ConcurrencyOptions(initial_interval_ms=v, max_interval_ms=v)),
    ("max_interval_ms", lambda v: ConcurrencyOptions(max_interval_ms=v)),
    ("initial_ms", lambda v: RetryPolicy(on=OSError, initial_ms=v, max_ms=v)),
    ("max_ms", lambda v: RetryPolicy(on=OSError, max_ms=v)),
    ("timeout_ms", lambda v: RetryPolicy(on=OSError, timeout_ms=v)),
    ("after_ms", lambda v: StaleOptions(after_ms=v)),
]


@pytest.mark.parametrize(("field", "build"), MS_OPTIONS)
@pytest.mark.parametrize("extra", [1, 10**20, 10**400, 10**5000], ids=["1", "e20", "e400", "e5000"])
def test_a_time_no_clock_holds_is_refused_when_built(
    field: str, build: Callable[[int], object], extra: int
) -> None:
    """10**400 ms was accepted, then overflowed a float mid-run (after the effect was
    stored, as failed, its handler never run). The error names the field and the bound."""
    maximum = MAX_LEASE_MS if field == "after_ms" else MAX_MS
    build(maximum)  # the bound itself is accepted
    with pytest.raises(EffectLedgerValidationError, match=f"{field} must be at most {maximum} "):
        build(maximum + extra)


async def test_a_huge_timeout_stores_nothing_and_a_tool_refuses_it_when_defined() -> None:
    store = MemoryStore()
    ledger = build_ledger(store)
    with pytest.raises(EffectLedgerValidationError, match="timeout_ms must be at most") as info:
        ledger.tool("t", timeout_ms=10**400)
    assert info.value.field == "timeout_ms"
    with pytest.raises(EffectLedgerValidationError, match="timeout_ms must be at most"):
        await ledger.run(
            ToolCall(workflow_id="wf", tool="t"), lambda e: 1, RunOptions(timeout_ms=10**400)
        )
    assert len(store) == 0
