"""The state machine table."""

from __future__ import annotations

import itertools

import pytest

from agent_ledger import EffectStatus as S
from agent_ledger.status import (
    CLAIMABLE,
    COMPLETIONS,
    DECISION_TARGETS,
    RELEASE,
    REOPEN,
    REOPENABLE,
    TERMINAL,
    TRANSITIONS,
    can_transition,
    decision_sources,
    sources_of,
)

# Written out from the specification, independently of the table under test.
ALLOWED = {
    (S.PROCESSING, S.PROCESSING),  # takeover of a stale holder
    (S.PROCESSING, S.SUCCEEDED),
    (S.PROCESSING, S.FAILED),
    (S.PROCESSING, S.CANCELED),
    (S.PROCESSING, S.READY),  # a release: given back by a run cancelled before its handler
    (S.REQUIRES_APPROVAL, S.READY),
    (S.REQUIRES_APPROVAL, S.DENIED),
    (S.REQUIRES_APPROVAL, S.CANCELED),
    (S.READY, S.PROCESSING),
    (S.READY, S.REQUIRES_APPROVAL),  # an approval taken back before the effect was claimed
    (S.READY, S.CANCELED),
    (S.FAILED, S.READY),  # reopened by a person, to run again
    (S.CANCELED, S.READY),  # reopened likewise
}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(S, S)))
def test_transition_table_matches_the_specification(source: S, target: S) -> None:
    """Exactly the specified transitions are allowed."""
    assert can_transition(source, target) == ((source, target) in ALLOWED)


def test_terminal_statuses_are_exactly_the_four_outcomes() -> None:
    """succeeded, failed, denied and canceled have no way out but a person's reopen."""
    assert {S.SUCCEEDED, S.FAILED, S.DENIED, S.CANCELED} == TERMINAL
    assert all(s.is_terminal == (s in TERMINAL) for s in S)


def test_every_status_has_a_row() -> None:
    """The table covers every status, so lookups never raise KeyError."""
    assert set(TRANSITIONS) == set(S)


@pytest.mark.parametrize("target", list(S))
def test_sources_of_inverts_the_table(target: S) -> None:
    """sources_of(target) is every status with an edge into target."""
    assert sources_of(target) == {s for (s, t) in ALLOWED if t == target}


def test_claims_are_the_edges_into_processing() -> None:
    """An approved run (ready) and a takeover (processing) are the only claims."""
    assert {S.READY, S.PROCESSING} == CLAIMABLE == sources_of(S.PROCESSING)


def test_completions_are_the_outcomes_reachable_from_processing() -> None:
    assert {S.SUCCEEDED, S.FAILED, S.CANCELED} == COMPLETIONS


def test_decisions_never_target_processing() -> None:
    """Only a claim (attempt + 1) reaches processing; only a commit records an outcome."""
    assert S.PROCESSING not in DECISION_TARGETS
    assert {S.REQUIRES_APPROVAL, S.READY, S.DENIED, S.CANCELED} == DECISION_TARGETS


def test_the_release_is_the_one_edge_from_processing_to_ready() -> None:
    assert RELEASE == (S.PROCESSING, S.READY)
    assert can_transition(*RELEASE)


def test_only_a_failure_or_a_cancellation_can_be_reopened() -> None:
    """A result is the receipt, and a denial stands: neither is ever reopened."""
    assert {(S.FAILED, S.READY), (S.CANCELED, S.READY)} == REOPEN
    assert {S.FAILED, S.CANCELED} == REOPENABLE
    assert all(can_transition(*edge) for edge in REOPEN)
    assert TRANSITIONS[S.SUCCEEDED] == TRANSITIONS[S.DENIED] == frozenset()


@pytest.mark.parametrize("target", list(S))
def test_decisions_never_take_the_release_edge(target: S) -> None:
    """approve() moves requires_approval to ready, never a processing or finished effect."""
    expected = {S.REQUIRES_APPROVAL} if target is S.READY else sources_of(target)
    assert decision_sources(target) == expected
