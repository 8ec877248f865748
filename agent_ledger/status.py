"""Effect statuses and the one table of allowed transitions.

Every other module (the engine, each store, the schema tests) derives what
it needs from :data:`TRANSITIONS`; nothing else lists them.

Seven kinds of step move an effect, and the table covers them all:

* a **claim** moves it *into* ``processing`` and increments ``attempt`` (the
  fencing token): from ``ready`` (an approved or released effect is run) or
  from ``processing`` itself (a **takeover**: the holder stopped heartbeating);
* a **completion** moves it from ``processing`` to an outcome;
* a **release** gives it back unrun, ``processing`` -> ``ready``
  (:data:`RELEASE`): a run cancelled after its begin or claim landed and
  before its handler started, so the next caller claims it at once instead of
  waiting out a lease nobody holds;
* a **reopen** sends a ``failed`` or ``canceled`` effect back to ``ready``
  (:data:`REOPEN`): an operator's way to have it run again (the handler was
  fixed, the outage is over). It is the only way out of those two statuses,
  and nothing takes an effect out of ``succeeded`` or ``denied``: a result is
  the receipt, and a denial stands (a new decision needs a new call);
* a **park** sends a ``processing`` effect to ``requires_approval``
  (:data:`PARK`): its holder ran the handler under ``on_stale="park"`` and
  then went silent for its whole lease, so nobody knows whether the side
  effect happened, and a person decides instead of a takeover. Fenced by the
  stale attempt, and only once the lease is out;
* a **retry** sends a ``failed`` effect straight back to ``processing``
  (:data:`RETRY`), attempt + 1, for the caller that asked again after a
  failure its tool declared retryable (``retryable=``): fenced by the failed
  attempt, so of any number of such callers exactly one runs the handler
  again. Nothing else claims a failed effect; a final failure stays final;
* a **resolve** records an outcome a person read from the provider,
  ``requires_approval`` -> ``succeeded`` or ``failed`` (:data:`RESOLVE`),
  for a parked effect only;
* a **decision** (request approval, approve, deny, cancel) is everything else.

A *running* effect (``processing``, its holder alive) can never be sent back
for approval by anyone else: its handler may be executing, so the approval
could not stop it, and its commit would then be refused and the handler run
a second time after the approval. A park takes only an effect whose holder
is gone; a **hold** (:data:`HOLD`) is the holder's own step, fenced by its
attempt, taken before it runs the tool. Effects that need approval by policy
are inserted as ``requires_approval``; ``request_approval`` from anyone but
the holder only sends a ``ready`` effect (approved or released, not yet
claimed) back for another look.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from agent_ledger.codes import ErrorCode


class EffectStatus(enum.StrEnum):
    #: A worker holds the effect (attempt ``n``) and is running the handler.
    PROCESSING = "processing"
    #: The handler returned; ``result`` is the receipt. Terminal.
    SUCCEEDED = "succeeded"
    #: The handler raised (or its result could not be stored); ``error`` says why. Terminal.
    FAILED = "failed"
    #: Waiting for a human to approve or deny; the handler has not run.
    REQUIRES_APPROVAL = "requires_approval"
    #: Claimable at once: approved, or released by a run cancelled before its
    #: handler started. The next caller to claim it runs the handler.
    READY = "ready"
    #: A human said no; ``error.message`` is the reason. Terminal.
    DENIED = "denied"
    #: Abandoned on purpose (admin cancel, or the running task was cancelled). Terminal.
    CANCELED = "canceled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


_S = EffectStatus

#: The state machine: each status mapped to the statuses it may move to.
TRANSITIONS: Final[Mapping[EffectStatus, frozenset[EffectStatus]]] = MappingProxyType(
    {
        # processing -> processing is a takeover: a claim with attempt + 1;
        # processing -> ready a release (never a decision: see RELEASE);
        # processing -> requires_approval a park (see PARK).
        _S.PROCESSING: frozenset(
            {_S.PROCESSING, _S.SUCCEEDED, _S.FAILED, _S.CANCELED, _S.READY, _S.REQUIRES_APPROVAL}
        ),
        # -> succeeded/failed: only resolve, for a parked effect (see RESOLVE).
        _S.REQUIRES_APPROVAL: frozenset(
            {_S.READY, _S.DENIED, _S.CANCELED, _S.SUCCEEDED, _S.FAILED}
        ),
        # ready -> requires_approval: an approval taken back before anyone claimed it.
        _S.READY: frozenset({_S.PROCESSING, _S.REQUIRES_APPROVAL, _S.CANCELED}),
        _S.SUCCEEDED: frozenset(),
        # failed/canceled -> ready: only reopen (see REOPEN), never automatic;
        # failed -> processing: only retry, after a retryable failure (see RETRY).
        _S.FAILED: frozenset({_S.READY, _S.PROCESSING}),
        _S.DENIED: frozenset(),
        _S.CANCELED: frozenset({_S.READY}),
    }
)

#: The edges only ``Store.reopen`` takes: a person sends a finished effect back to run again.
REOPEN: Final[frozenset[tuple[EffectStatus, EffectStatus]]] = frozenset(
    {(_S.FAILED, _S.READY), (_S.CANCELED, _S.READY)}
)
#: The statuses ``reopen`` takes an effect from.
REOPENABLE: Final[frozenset[EffectStatus]] = frozenset(source for source, _ in REOPEN)
#: The edge only ``Store.retry_failed`` takes: a later call runs a failure its
#: tool declared retryable again, as a new attempt (fenced by the failed one).
RETRY: Final = (_S.FAILED, _S.PROCESSING)
#: The edge only ``Store.park`` takes: the holder of a run under
#: ``on_stale="park"`` went silent after its handler started, so the effect
#: waits for a person instead of being taken over. Fenced by the stale attempt.
#: The holder itself takes the same edge, before its handler starts, when it
#: decides the call needs a person (:data:`HOLD`).
PARK: Final = (_S.PROCESSING, _S.REQUIRES_APPROVAL)
#: The same edge taken by the holder (``Store.release(..., for_approval=True)``,
#: fenced by its attempt): a ``begin()`` worker that decides, before running
#: the tool, that a person must approve it (``request_approval`` by the holder).
HOLD: Final = PARK
#: The edges only ``Store.settle`` takes for ``resolve()``: a person records the
#: outcome of a parked effect's run, as the provider reports it.
RESOLVE: Final[frozenset[tuple[EffectStatus, EffectStatus]]] = frozenset(
    {(_S.REQUIRES_APPROVAL, _S.SUCCEEDED), (_S.REQUIRES_APPROVAL, _S.FAILED)}
)
#: The code a parked effect's ``error`` carries: the reason it waits for a
#: person (an effect waiting because a policy asked for approval has none).
#: An alias of ``ErrorCode.AMBIGUOUS_ATTEMPT``, kept for code that imports it from here.
AMBIGUOUS_ATTEMPT: Final = ErrorCode.AMBIGUOUS_ATTEMPT

#: Statuses whose outcome is final: nothing but a person's reopen (or, for a
#: failure declared retryable, a later call's retry) leads out of them.
TERMINAL: Final[frozenset[EffectStatus]] = frozenset(
    s for s, out in TRANSITIONS.items() if all((s, t) in REOPEN or (s, t) == RETRY for t in out)
)


#: Statuses a claim takes an effect from (into ``processing``, attempt + 1).
#: From ``processing`` only when the holder's heartbeat is stale: a takeover.
#: Never ``failed``: only ``Store.retry_failed`` takes that edge (:data:`RETRY`).
CLAIMABLE: Final[frozenset[EffectStatus]] = frozenset(
    s for s, out in TRANSITIONS.items() if _S.PROCESSING in out and (s, _S.PROCESSING) != RETRY
)
#: The outcomes ``Store.commit`` may record: terminal statuses reachable from processing.
COMPLETIONS: Final[frozenset[EffectStatus]] = frozenset(
    s for s in TRANSITIONS[_S.PROCESSING] if s in TERMINAL
)
#: The edge only ``Store.release`` takes, fenced by the holder's attempt. Approving
#: goes to ``ready`` too, but only from ``requires_approval``: no decision may
#: take an effect from its holder (see :func:`decision_sources`).
RELEASE: Final = (_S.PROCESSING, _S.READY)
#: Outcomes a handler's commit records: no decision claims success or failure
#: (``resolve`` does, for a parked effect only: :data:`RESOLVE`).
HANDLER_OUTCOMES: Final[frozenset[EffectStatus]] = frozenset({_S.SUCCEEDED, _S.FAILED})
#: What a decision may set: every target but ``processing`` (only a claim reaches
#: it) and the handler's own outcomes (a person records those only through
#: ``resolve``, :data:`RESOLVE`).
DECISION_TARGETS: Final[frozenset[EffectStatus]] = (
    frozenset(t for out in TRANSITIONS.values() for t in out) - {_S.PROCESSING} - HANDLER_OUTCOMES
)


#: What ``Store.settle`` may set from ``requires_approval``: approve (``ready``),
#: deny (``denied``), and resolve's two outcomes.
SETTLE_TARGETS: Final[frozenset[EffectStatus]] = frozenset(
    {_S.READY, _S.DENIED} | {target for _, target in RESOLVE}
)


def can_transition(source: EffectStatus, target: EffectStatus) -> bool:
    """Whether the state machine allows ``source -> target``."""
    return target in TRANSITIONS[source]


def sources_of(target: EffectStatus) -> frozenset[EffectStatus]:
    """Every status from which ``target`` may be reached, by any kind of step."""
    return _SOURCES[target]


def decision_sources(target: EffectStatus) -> frozenset[EffectStatus]:
    """Every status from which a decision (``Store.transition``) may reach ``target``.

    ``sources_of(target)`` without the :data:`RELEASE`, :data:`REOPEN`,
    :data:`RETRY`, :data:`PARK` and :data:`RESOLVE` edges: ``approve()`` moves only
    ``requires_approval`` to ``ready``, never
    a ``processing`` effect, whose holder may be running its handler, nor a
    finished one. Stores use this as the ``WHERE status IN (...)`` half of a
    decision's compare-and-set.
    """
    return _DECISION_SOURCES[target]


_SOURCES: Final[Mapping[EffectStatus, frozenset[EffectStatus]]] = MappingProxyType(
    {
        target: frozenset(s for s, out in TRANSITIONS.items() if target in out)
        for target in EffectStatus
    }
)
_DECISION_SOURCES: Final[Mapping[EffectStatus, frozenset[EffectStatus]]] = MappingProxyType(
    {
        target: frozenset(
            s
            for s in sources
            if (s, target) not in (RELEASE, PARK, RETRY)
            and (s, target) not in REOPEN
            and (s, target) not in RESOLVE
        )
        for target, sources in _SOURCES.items()
    }
)
