"""RetryPolicy: checked when made, what it retries, and how long it waits."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import EffectLedgerValidationError, MemoryStore, RetryPolicy, RunOptions
from agent_ledger.clock import ManualClock
from agent_ledger.options import merge_run_options, resolve
from agent_ledger.retries import NonRetryableError, asked_delay_s
from agent_ledger.testing import build_ledger


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"on": ()}, "on"),
        ({"on": "ConnectionError"}, "on"),
        ({"on": (ConnectionError, 3)}, "on"),
        ({"on": asyncio.CancelledError}, "on"),
        ({"on": KeyboardInterrupt}, "on"),
        ({"on": OSError, "attempts": 0}, "attempts"),
        ({"on": OSError, "attempts": True}, "attempts"),
        ({"on": OSError, "attempts": 2.0}, "attempts"),
        ({"on": OSError, "initial_ms": 0}, "initial_ms"),
        ({"on": OSError, "max_ms": 10, "initial_ms": 20}, "max_ms"),
        ({"on": OSError, "multiplier": 0.5}, "multiplier"),
        ({"on": OSError, "multiplier": float("inf")}, "multiplier"),
        ({"on": OSError, "jitter": 1.5}, "jitter"),
        ({"on": OSError, "jitter": "some"}, "jitter"),
        ({"on": OSError, "timeout_ms": 0}, "timeout_ms"),
    ],
)
def test_a_bad_policy_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(EffectLedgerValidationError) as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_on_is_required() -> None:
    """Nothing is retried unless asked for by type: no default for on."""
    with pytest.raises(TypeError):
        RetryPolicy()  # type: ignore[call-arg]


def test_what_is_retried() -> None:
    class Declined(OSError):
        non_retryable = True

    class Flaky(OSError):
        @property
        def non_retryable(self) -> bool:
            raise RuntimeError("broken attribute")

    policy = RetryPolicy(on=(OSError, NonRetryableError))
    assert policy.retries(ConnectionError("reset")), "subclasses of `on` too"
    assert policy.retries(Flaky()), "a broken opt-out is no opt-out"
    assert not policy.retries(ValueError("not in on"))
    assert not policy.retries(Declined("declined")), "non_retryable = True"
    assert not policy.retries(NonRetryableError("stop")), "even when named in on"
    validation = RetryPolicy(on=ValueError)
    assert not validation.retries(EffectLedgerValidationError("bad input"))


def test_delays_grow_are_capped_and_jittered() -> None:
    policy = RetryPolicy(on=OSError, initial_ms=100, multiplier=3, max_ms=500, jitter=0.2)
    assert [policy.delay(n, OSError(), uniform=lambda a, b: 0.0) for n in (1, 2, 3, 4)] == [
        0.1,
        pytest.approx(0.3),
        0.5,
        0.5,
    ]
    assert policy.delay(1, OSError(), uniform=lambda a, b: b) == pytest.approx(0.12)
    assert policy.delay(1, OSError(), uniform=lambda a, b: a) == pytest.approx(0.08)


class Slow(Exception):
    def __init__(self, retry_after_s: object) -> None:
        self.retry_after_s = retry_after_s


@pytest.mark.parametrize(
    ("asked", "delay"),
    [(2, 2.0), (0, 0.0), (0.5, 0.5), (30, 5.0), (-1, 0.1), (float("nan"), 0.1), ("3", 0.1)],
)
def test_retry_after_s_is_used_clamped_or_ignored(asked: object, delay: float) -> None:
    policy = RetryPolicy(on=Slow, initial_ms=100, max_ms=5_000, jitter=0)
    assert policy.delay(1, Slow(asked)) == delay


def test_a_retry_after_hint_that_breaks_is_ignored() -> None:
    class Broken(Exception):
        @property
        def retry_after_s(self) -> float:
            raise RuntimeError("no")

    assert asked_delay_s(Broken()) is None


def test_no_retry_by_default_and_a_call_replaces_the_ledgers_policy_whole() -> None:
    assert resolve(RunOptions()).retry is None
    ledger = RunOptions(retry=RetryPolicy(on=OSError, attempts=5))
    mine = RetryPolicy(on=TimeoutError, attempts=2)
    assert resolve(merge_run_options(ledger, RunOptions())).retry == ledger.retry
    assert resolve(merge_run_options(ledger, RunOptions(retry=mine))).retry == mine
    assert resolve(merge_run_options(ledger, RunOptions(retry=None))).retry is None


def test_run_options_check_the_policy() -> None:
    with pytest.raises(EffectLedgerValidationError) as info:
        RunOptions(retry=5)  # type: ignore[arg-type]
    assert info.value.field == "retry"


async def test_a_manual_clock_sleeps_without_waiting() -> None:
    clock = ManualClock()
    before = clock()
    await clock.sleep(1.5)
    await clock.sleep(0.25)
    assert clock.slept == [1.5, 0.25]
    assert (clock() - before).total_seconds() == 1.75


def test_a_tools_retry_is_its_run_options_retry() -> None:
    ledger = build_ledger(MemoryStore())
    policy = RetryPolicy(on=TimeoutError)

    @ledger.tool("a", retry=policy)
    async def a() -> None: ...

    assert a.run_options == RunOptions(retry=policy)

    @ledger.tool("b", run_options=RunOptions(wait_for_approval=False), retry=policy)
    async def b() -> None: ...

    assert b.run_options == RunOptions(wait_for_approval=False, retry=policy)
    with pytest.raises(EffectLedgerValidationError, match="given twice") as twice:
        ledger.tool("c", run_options=RunOptions(retry=None), retry=policy)
    assert twice.value.field == "retry"
    with pytest.raises(EffectLedgerValidationError) as bad:
        ledger.tool("d", retry=3)  # type: ignore[arg-type]
    assert bad.value.field == "retry"
    assert set(ledger.tools) == {"a", "b"}
