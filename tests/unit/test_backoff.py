"""The one delay schedule: growth, cap, jitter, deadlines, bounded tries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_ledger.backoff import COMMIT_RETRY, LISTENER_RECONNECT, Backoff


def test_grows_by_the_multiplier_up_to_the_cap() -> None:
    schedule = Backoff(initial_s=0.05, multiplier=1.5, max_s=0.2)
    assert [round(schedule.base(n), 6) for n in range(6)] == [
        0.05,
        0.075,
        0.1125,
        0.16875,
        0.2,
        0.2,
    ]


def test_a_huge_step_stays_at_the_cap_without_overflow() -> None:
    assert Backoff(initial_s=1.0, multiplier=10.0, max_s=30.0).base(10_000) == 30.0


@given(
    initial=st.floats(0.001, 1.0),
    multiplier=st.floats(1.0, 4.0),
    extra=st.floats(0.0, 10.0),
    jitter=st.floats(0.0, 1.0),
    step=st.integers(0, 200),
    u=st.floats(-1.0, 1.0),
)
def test_jitter_stays_within_its_band(
    initial: float, multiplier: float, extra: float, jitter: float, step: int, u: float
) -> None:
    schedule = Backoff(
        initial_s=initial, multiplier=multiplier, max_s=initial + extra, jitter=jitter
    )
    base = schedule.base(step)
    delay = schedule.delay(step, uniform=lambda a, b: u)
    assert base * (1 - jitter) - 1e-12 <= delay <= base * (1 + jitter) + 1e-12
    assert initial - 1e-12 <= base <= initial + extra + 1e-12


def test_never_sleeps_past_the_remaining_budget() -> None:
    schedule = Backoff(initial_s=1.0, max_s=1.0)
    assert schedule.delay(0, remaining_s=0.25) == 0.25
    assert schedule.delay(0, remaining_s=-3.0) == 0.0
    assert schedule.delay(0, remaining_s=5.0) == 1.0


def test_bounded_schedules_give_up() -> None:
    schedule = Backoff(initial_s=0.1, tries=2)
    assert not schedule.gives_up_after(0)
    assert not schedule.gives_up_after(1)
    assert schedule.gives_up_after(2)
    with pytest.raises(IndexError):
        schedule.base(2)


def test_the_named_schedules() -> None:
    """Commit retries go at most a second apart, with no count of their own (the
    lease bounds them); the listener backs off to 5 s."""
    assert [COMMIT_RETRY.delay(n) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert not COMMIT_RETRY.gives_up_after(10**6)
    assert LISTENER_RECONNECT.base(0) == 0.05 and LISTENER_RECONNECT.base(50) == 5.0
    assert not LISTENER_RECONNECT.gives_up_after(10**6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_s": 0.0},
        {"initial_s": 1.0, "max_s": 0.5},
        {"initial_s": 1.0, "multiplier": 0.5},
        {"initial_s": 1.0, "jitter": 1.5},
        {"initial_s": 1.0, "tries": -1},
    ],
)
def test_nonsense_schedules_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need"):
        Backoff(**kwargs)  # type: ignore[arg-type]
