"""Effect statuses and the one table of allowed transitions.

Every other module (the ledger, each store, the SQL CHECK constraint test)
derives what it needs from :data:`TRANSITIONS`; nothing else lists them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final


class EffectStatus(enum.StrEnum):
    #: A worker holds the effect (attempt ``n``) and is running the handler.
    PROCESSING = "processing"
    #: The handler returned; ``result`` is the receipt. Terminal.
    SUCCEEDED = "succeeded"
    #: The handler raised (or its result could not be stored); ``error`` says why. Terminal.
    FAILED = "failed"
    #: Waiting for a human to approve or deny; the handler has not run.
    REQUIRES_APPROVAL = "requires_approval"
    #: Approved; the next caller to claim it runs the handler.
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
        _S.PROCESSING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.REQUIRES_APPROVAL, _S.CANCELED}),
        _S.REQUIRES_APPROVAL: frozenset({_S.READY, _S.DENIED, _S.CANCELED}),
        _S.READY: frozenset({_S.PROCESSING, _S.CANCELED}),
        _S.SUCCEEDED: frozenset(),
        _S.FAILED: frozenset(),
        _S.DENIED: frozenset(),
        _S.CANCELED: frozenset(),
    }
)

#: Statuses with no way out: the outcome is final.
TERMINAL: Final[frozenset[EffectStatus]] = frozenset(s for s, out in TRANSITIONS.items() if not out)


def can_transition(source: EffectStatus, target: EffectStatus) -> bool:
    """Whether the state machine allows ``source -> target``."""
    return target in TRANSITIONS[source]


def sources_of(target: EffectStatus) -> frozenset[EffectStatus]:
    """Every status from which ``target`` may be reached.

    Stores use this as the ``WHERE status IN (...)`` half of a compare-and-set.
    """
    return _SOURCES[target]


_SOURCES: Final[Mapping[EffectStatus, frozenset[EffectStatus]]] = MappingProxyType(
    {
        target: frozenset(s for s, out in TRANSITIONS.items() if target in out)
        for target in EffectStatus
    }
)
