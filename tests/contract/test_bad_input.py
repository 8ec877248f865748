"""Bad input: a clear error naming what was wrong, and nothing stored."""

from __future__ import annotations

import math

import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    RunOptions,
    ToolCall,
)
from agent_ledger.options import ConcurrencyOptions
from tests.approvals import make_pending
from tests.harness import StoreHarness


@pytest.mark.parametrize(
    "args",
    [
        {"x": {1, 2}},
        {"x": b"bytes"},
        {"x": math.nan},
        {"x": math.inf},
        {"x": object()},
        {"x": {3: "non-string key"}},
        {"x": "\udfff"},
        {"x": 2**70},
    ],
)
async def test_non_json_args_store_nothing(harness: StoreHarness, args: dict[str, object]) -> None:
    """run() and begin() reject non-JSON args before touching the store."""
    ledger = harness.ledger()
    call = ToolCall(workflow_id="w", tool="t", args=args)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError) as info:
        await ledger.run(call, lambda e: 1)
    assert info.value.field == "args"
    with pytest.raises(EffectLedgerValidationError):
        await ledger.begin(call)
    assert await harness.raw_count() == 0


async def test_oversized_args_store_nothing(harness: StoreHarness) -> None:
    """Args over max_args_size_bytes are rejected with both sizes in the message."""
    ledger = EffectLedger(EffectLedgerOptions(store=harness.store, max_args_size_bytes=1_000))
    call = ToolCall(workflow_id="w", tool="t", args={"blob": "x" * 2_000})
    with pytest.raises(
        EffectLedgerValidationError, match=r"2\d{3} bytes .* max_args_size_bytes=1000"
    ):
        await ledger.run(call, lambda e: 1)
    assert await harness.raw_count() == 0


async def test_default_size_limit_is_one_mebibyte(harness: StoreHarness) -> None:
    """Without max_args_size_bytes, 1 MiB of canonical args is the limit."""
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError, match="max_args_size_bytes=1048576"):
        await ledger.run(
            ToolCall(workflow_id="w", tool="t", args={"b": "x" * 1_048_576}), lambda e: 1
        )
    assert await harness.raw_count() == 0


@pytest.mark.parametrize(
    ("call_args", "field"),
    [
        (({"workflow_id": "w"}, lambda e: 1), "call"),
        (
            (ToolCall(workflow_id="w", tool="t"), lambda e: 1, {"requires_approval": True}),
            "run_options",
        ),
    ],
)
async def test_wrong_argument_types_to_run(
    harness: StoreHarness, call_args: tuple[object, ...], field: str
) -> None:
    """Passing a dict where a ToolCall or RunOptions belongs gets a named error."""
    ledger = harness.ledger()
    with pytest.raises(EffectLedgerValidationError) as info:
        await ledger.run(*call_args)  # type: ignore[call-overload]
    assert info.value.field == field
    assert await harness.raw_count() == 0


async def test_admin_calls_reject_non_string_keys(harness: StoreHarness) -> None:
    """approve(None) is a programming error, not 'unknown key'."""
    ledger = harness.ledger()
    for method in (ledger.approve, ledger.cancel, ledger.find_by_idem_key, ledger.get_effect):
        with pytest.raises(EffectLedgerValidationError):
            await method(None)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="reason"):
        await ledger.deny("k" * 64, reason=42)  # type: ignore[arg-type]


SQLISH = "'; DROP TABLE effects; -- \" OR 1=1 /* $$ \\x00"


async def test_sql_looking_text_is_stored_verbatim(harness: StoreHarness) -> None:
    """Text that looks like SQL in every field is data, round-tripped exactly."""
    ledger = harness.ledger()
    call = ToolCall(workflow_id=SQLISH, tool=SQLISH, args={SQLISH: SQLISH}, call_id=SQLISH)
    assert await ledger.run(call, lambda e: {SQLISH: [SQLISH]}) == {SQLISH: [SQLISH]}
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None
    assert (effect.workflow_id, effect.tool, effect.call_id) == (SQLISH, SQLISH, SQLISH)
    assert effect.result == {SQLISH: [SQLISH]}
    pending = await make_pending(ledger, ToolCall(workflow_id="w2", tool="t"))
    assert await ledger.deny(pending.idem_key, reason=SQLISH)
    denied = await ledger.find_by_idem_key(pending.idem_key)
    assert denied is not None and denied.error is not None and denied.error.message == SQLISH


async def test_invalid_per_call_options_store_nothing(harness: StoreHarness) -> None:
    """Options that only fail once merged (initial > ledger max) fail before begin."""
    ledger = harness.ledger(RunOptions(concurrency=ConcurrencyOptions(max_interval_ms=100)))
    with pytest.raises(EffectLedgerValidationError, match="initial_interval_ms"):
        await ledger.run(
            ToolCall(workflow_id="w", tool="t"),
            lambda e: 1,
            RunOptions(concurrency=ConcurrencyOptions(initial_interval_ms=500)),
        )
    assert await harness.raw_count() == 0
