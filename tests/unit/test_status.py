"""The state machine table."""

from __future__ import annotations

import itertools

import pytest

from agent_ledger import EffectStatus as S
from agent_ledger.status import (
    CLAIMABLE,
    COMPLETIONS,
    DECISION_TARGETS,
    PARK,
    RELEASE,
    REOPEN,
    REOPENABLE,
    RESOLVE,
    RETRY,
    SETTLE_TARGETS,
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
    (S.PROCESSING, S.REQUIRES_APPROVAL),  # a park: the holder went silent mid-handler
    (S.REQUIRES_APPROVAL, S.READY),
    (S.REQUIRES_APPROVAL, S.DENIED),
    (S.REQUIRES_APPROVAL, S.CANCELED),
    (S.REQUIRES_APPROVAL, S.SUCCEEDED),  # resolved by a person: it did happen
    (S.REQUIRES_APPROVAL, S.FAILED),  # resolved by a person: it failed
    (S.READY, S.PROCESSING),
    (S.READY, S.REQUIRES_APPROVAL),  # an approval taken back before the effect was claimed
    (S.READY, S.CANCELED),
    (S.FAILED, S.READY),  # reopened by a person, to run again
    (S.FAILED, S.PROCESSING),  # retried by a later call, after a retryable failure
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
    """An approved run (ready) and a takeover (processing) are the only claims; the
    third edge into processing, from failed, is the retry's alone."""
    assert {S.READY, S.PROCESSING} == CLAIMABLE
    assert sources_of(S.PROCESSING) == CLAIMABLE | {S.FAILED}
    assert RETRY == (S.FAILED, S.PROCESSING)
    assert S.FAILED in TERMINAL and S.FAILED not in CLAIMABLE


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
def test_decisions_never_take_the_release_park_or_resolve_edges(target: S) -> None:
    """approve() moves requires_approval to ready, never a processing or finished effect;
    no decision parks a processing effect or records a handler's outcome."""
    special = {RELEASE, PARK, RETRY, *REOPEN, *RESOLVE}
    expected = {s for s in sources_of(target) if (s, target) not in special}
    assert decision_sources(target) == expected
    assert decision_sources(S.READY) == {S.REQUIRES_APPROVAL}
    assert decision_sources(S.REQUIRES_APPROVAL) == {S.READY}


def test_park_and_resolve_are_their_own_edges() -> None:
    """A park is the one way from processing back to a person; resolve the one way a
    person records succeeded or failed, from requires_approval only."""
    assert PARK == (S.PROCESSING, S.REQUIRES_APPROVAL)
    assert {(S.REQUIRES_APPROVAL, S.SUCCEEDED), (S.REQUIRES_APPROVAL, S.FAILED)} == RESOLVE
    assert all(can_transition(*edge) for edge in (PARK, *RESOLVE))
    assert {S.READY, S.DENIED, S.SUCCEEDED, S.FAILED} == SETTLE_TARGETS
    # Derived sets are unchanged by the new edges.
    assert S.REQUIRES_APPROVAL not in TERMINAL and S.REQUIRES_APPROVAL not in COMPLETIONS
