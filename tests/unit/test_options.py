"""Run options: validation and field-by-field merging."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent_ledger import EffectLedgerOptions, EffectLedgerValidationError, MemoryStore, RunOptions
from agent_ledger.options import (
    DEFAULT_STALE_AFTER_MS,
    DEFAULT_TX_LOCK_TIMEOUT_MS,
    ConcurrencyOptions,
    StaleOptions,
    merge_run_options,
    resolve,
)


def test_builtin_defaults_are_the_documented_ones() -> None:
    """An empty RunOptions resolves to the documented defaults."""
    r = resolve(RunOptions())
    assert r.requires_approval is False
    c = r.concurrency
    assert (c.wait_timeout_ms, c.approval_timeout_ms) == (30_000, None)
    assert (c.initial_interval_ms, c.max_interval_ms) == (50, 1_000)
    assert (c.backoff_multiplier, c.jitter_factor) == (1.5, 0.3)
    assert r.stale_after_ms == DEFAULT_STALE_AFTER_MS == 15_000


def test_unset_fields_fall_through_field_by_field() -> None:
    """A per-call field overrides; its unset siblings keep the ledger default."""
    ledger = RunOptions(
        concurrency=ConcurrencyOptions(wait_timeout_ms=5_000, initial_interval_ms=10)
    )
    call = RunOptions(concurrency=ConcurrencyOptions(initial_interval_ms=20))
    r = resolve(merge_run_options(ledger, call))
    assert r.concurrency.wait_timeout_ms == 5_000
    assert r.concurrency.initial_interval_ms == 20
    assert r.concurrency.max_interval_ms == 1_000


def test_explicit_none_does_not_fall_through() -> None:
    """approval_timeout_ms=None per call wins over a ledger default of 10 s."""
    ledger = RunOptions(concurrency=ConcurrencyOptions(approval_timeout_ms=10_000))
    call = RunOptions(concurrency=ConcurrencyOptions(approval_timeout_ms=None))
    assert resolve(merge_run_options(ledger, call)).concurrency.approval_timeout_ms is None
    assert (
        resolve(merge_run_options(ledger, RunOptions())).concurrency.approval_timeout_ms == 10_000
    )


def test_explicit_none_for_nested_options_resets_to_builtin() -> None:
    """concurrency=None / stale=None per call mean the built-in defaults, not the ledger's."""
    ledger = RunOptions(
        concurrency=ConcurrencyOptions(wait_timeout_ms=1), stale=StaleOptions(after_ms=7)
    )
    r = resolve(merge_run_options(ledger, RunOptions(concurrency=None, stale=None)))
    assert r.concurrency.wait_timeout_ms == 30_000
    assert r.stale_after_ms == DEFAULT_STALE_AFTER_MS


def test_requires_approval_false_per_call_overrides_ledger_true() -> None:
    """An explicit False is a value, not 'unset'."""
    merged = merge_run_options(
        RunOptions(requires_approval=True), RunOptions(requires_approval=False)
    )
    assert resolve(merged).requires_approval is False


# The `type: ignore[arg-type]` values below are wrong on purpose: the runtime check is under test.
@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ConcurrencyOptions(wait_timeout_ms=-1), "wait_timeout_ms"),
        (lambda: ConcurrencyOptions(approval_timeout_ms=-5), "approval_timeout_ms"),
        (lambda: ConcurrencyOptions(initial_interval_ms=0), "initial_interval_ms"),
        (lambda: ConcurrencyOptions(max_interval_ms=-1), "max_interval_ms"),
        (
            lambda: ConcurrencyOptions(initial_interval_ms=500, max_interval_ms=100),
            "initial_interval_ms",
        ),
        (lambda: ConcurrencyOptions(backoff_multiplier=0.5), "backoff_multiplier"),
        (lambda: ConcurrencyOptions(jitter_factor=1.5), "jitter_factor"),
        (lambda: ConcurrencyOptions(jitter_factor=-0.1), "jitter_factor"),
        (lambda: ConcurrencyOptions(wait_timeout_ms="30s"), "wait_timeout_ms"),  # type: ignore[arg-type]
        (lambda: ConcurrencyOptions(wait_timeout_ms=True), "wait_timeout_ms"),
        (lambda: ConcurrencyOptions(wait_timeout_ms=1.5), "wait_timeout_ms"),  # type: ignore[arg-type]
        (lambda: ConcurrencyOptions(backoff_multiplier=float("nan")), "backoff_multiplier"),
        (lambda: StaleOptions(after_ms=-1), "after_ms"),
        (lambda: StaleOptions(after_ms=None), "after_ms"),  # type: ignore[arg-type]
        (lambda: RunOptions(requires_approval="yes"), "requires_approval"),  # type: ignore[arg-type]
        (lambda: RunOptions(concurrency={"wait_timeout_ms": 1}), "concurrency"),  # type: ignore[arg-type]
        (lambda: RunOptions(stale=5), "stale"),  # type: ignore[arg-type]
        (
            lambda: EffectLedgerOptions(store=MemoryStore(), max_args_size_bytes=0),
            "max_args_size_bytes",
        ),
    ],
)
def test_invalid_options_name_the_field(make: Callable[[], object], field: str) -> None:
    """Each invalid value raises EffectLedgerValidationError naming its field."""
    with pytest.raises(EffectLedgerValidationError) as info:
        make()
    assert info.value.field == field
    assert field in str(info.value)


def test_merge_that_inverts_interval_order_is_rejected() -> None:
    """A per-call initial interval above the ledger's max interval is caught at resolve time."""
    ledger = RunOptions(concurrency=ConcurrencyOptions(max_interval_ms=100))
    call = RunOptions(concurrency=ConcurrencyOptions(initial_interval_ms=500))
    with pytest.raises(EffectLedgerValidationError, match="must not exceed"):
        resolve(merge_run_options(ledger, call))


def test_lock_waits_in_a_transaction_use_wait_timeout_ms_only_when_someone_set_it() -> None:
    """The built-in 30 s wait does not bound lock waits in a transaction; a set one does."""
    ledger = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=500))
    cases = [
        (RunOptions(), None, DEFAULT_TX_LOCK_TIMEOUT_MS),
        (ledger, None, 500),
        (ledger, RunOptions(stale=StaleOptions(after_ms=9)), 500),
        (ledger, RunOptions(concurrency=ConcurrencyOptions(initial_interval_ms=9)), 500),
        (ledger, RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=70)), 70),
        (ledger, RunOptions(concurrency=None), DEFAULT_TX_LOCK_TIMEOUT_MS),
        (RunOptions(), RunOptions(stale=StaleOptions(after_ms=9)), DEFAULT_TX_LOCK_TIMEOUT_MS),
    ]
    for defaults, call, expected in cases:
        resolved = resolve(merge_run_options(defaults, call))
        assert resolved.tx_lock_timeout_ms == expected, (defaults, call)
        assert resolved.concurrency.wait_timeout_ms in (500, 70, 30_000)
