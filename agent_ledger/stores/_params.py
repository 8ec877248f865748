"""The parameters both SQL stores send with their statements, built once.

The statements differ by dialect (``_postgres_queries``, ``_sqlite_queries``)
but take the same named parameters, so each dict is assembled here; a
:class:`Dialect` supplies the only differences: how a list of statuses, an
error and a moment are passed. Each builder returns a fresh dict, which the
store may extend (SQLite adds ``now``, its clock reading).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import orjson

from agent_ledger.codes import ErrorCode
from agent_ledger.effects import (
    PARKED,
    REOPENED,
    RETRYABLE_FAILURE,
    RUN_ENDS,
    SETTLED,
    TRY_FAILED,
    EffectError,
    storable_text,
)
from agent_ledger.status import (
    CLAIMABLE,
    REOPENABLE,
    EffectStatus,
    decision_sources,
)
from agent_ledger.stores.base import Decision, EffectQuery, NewEffect

__all__ = [
    "LIST_FILTER_NAMES",
    "Dialect",
    "begin_params",
    "claim_params",
    "commit_params",
    "list_params",
    "mark_started_params",
    "park_params",
    "record_try_params",
    "release_params",
    "reopen_params",
    "retry_failed_params",
    "settle_params",
    "transition_params",
]

_PROCESSING: Final = EffectStatus.PROCESSING.value
_REQUIRES_APPROVAL: Final = EffectStatus.REQUIRES_APPROVAL.value
_READY: Final = EffectStatus.READY.value


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one SQL store passes the values whose form depends on its driver and schema."""

    #: A set of statuses as one parameter (a list for ``= ANY``, JSON text for ``json_each``).
    statuses: Callable[[Iterable[EffectStatus]], object]
    #: An error (or None) as the parameters its columns take.
    error: Callable[[EffectError | None], dict[str, object]]
    #: A moment as its column stores it.
    moment: Callable[[datetime], object]


def begin_params(new: NewEffect) -> dict[str, object]:
    """For begin's insert: the new effect's values, inserted as ``processing``, or as
    ``requires_approval`` when it must wait for a person."""
    return {
        "idem_key": new.idem_key,
        "workflow_id": new.workflow_id,
        "call_id": new.call_id,
        "tool": new.tool,
        "args_canonical": new.args_canonical,
        "resource_id_canonical": new.resource_id_canonical,
        "status": _REQUIRES_APPROVAL if new.requires_approval else _PROCESSING,
        # An effect inserted as processing is handed to its creator's handler.
        "executions": 0 if new.requires_approval else 1,
        "lease_ms": new.lease_ms,
        # "[]", or the turn and scope it was created in (effects.Scoped).
        "history": new.history,
    }


def claim_params(
    dialect: Dialect, idem_key: str, *, stale_after_ms: int, lease_ms: int | None
) -> dict[str, object]:
    """For the claim: the statuses it may take the effect from (``CLAIMABLE``),
    the caller's stale window (at least this much staleness lets it take
    ``processing`` over; 0: never), and the lease it records if it wins
    (``None``: the stale window)."""
    return {
        "idem_key": idem_key,
        "claimable": dialect.statuses(CLAIMABLE),
        "processing": _PROCESSING,
        "stale_ms": stale_after_ms,
        "lease_ms": stale_after_ms if lease_ms is None else lease_ms,
    }


def commit_params(
    dialect: Dialect,
    effect_id: str,
    *,
    attempt: int | None,
    status: EffectStatus,
    result_json: str | None,
    error: EffectError | None,
    ends_try: bool = True,
    usage_json: str | None = None,
    started: bool = True,
    retryable: bool = False,
) -> dict[str, object]:
    """For the commit compare-and-set (``processing`` -> ``status`` at ``attempt``);
    ``tried`` is what it adds to ``tries``, ``unstarted`` what it takes from
    ``executions`` (1 when the attempt's handler never started); ``retryable``
    (a failure only) appends a ``RetryableFailure`` of the error to the history."""
    return {
        "retryable": retryable and status is EffectStatus.FAILED and error is not None,
        "retryable_kind": RETRYABLE_FAILURE,
        "id": effect_id,
        "attempt": attempt,
        "status": status.value,
        "result": result_json,
        "usage": usage_json,
        "processing": _PROCESSING,
        "tried": 1 if ends_try else 0,
        "unstarted": 0 if started else 1,
        **dialect.error(error),
    }


def record_try_params(
    effect_id: str, *, attempt: int, error: EffectError, error_type: str
) -> dict[str, object]:
    """For record_try (``processing`` at ``attempt``: one more try, its failure appended).

    ``event`` is the ``TryFailure`` as JSON text without the two values the
    statement adds from the row and the store's clock: ``try`` (the new
    ``tries``) and ``at``.
    """
    event = {
        "kind": TRY_FAILED,
        "attempt": attempt,
        "message": error.message,
        "code": error.code,
        "type": storable_text(error_type),
    }
    return {
        "id": effect_id,
        "attempt": attempt,
        "processing": _PROCESSING,
        "event": orjson.dumps(event).decode(),
    }


def reopen_params(dialect: Dialect, idem_key: str, *, by: str, reason: str) -> dict[str, object]:
    """For the reopen compare-and-set: from any of ``REOPENABLE`` to ``ready``."""
    return {
        "idem_key": idem_key,
        "sources": dialect.statuses(REOPENABLE),
        "ready": _READY,
        "kind": REOPENED,
        "by": by,
        "reason": reason,
    }


def release_params(
    effect_id: str, *, attempt: int, for_approval: bool = False
) -> dict[str, object]:
    """For the release compare-and-set (``processing`` at ``attempt`` -> ``ready``, or
    ``requires_approval`` when the holder gives it back to wait for a person)."""
    return {
        "id": effect_id,
        "attempt": attempt,
        "processing": _PROCESSING,
        "ready": _REQUIRES_APPROVAL if for_approval else _READY,
    }


def transition_params(
    dialect: Dialect,
    idem_key: str,
    *,
    target: EffectStatus,
    error: EffectError | None,
    decision: Decision | None,
    sources: frozenset[EffectStatus] | None = None,
) -> dict[str, object]:
    """For the transition compare-and-set: from any of ``sources`` (by default
    ``decision_sources(target)``) to ``target``."""
    return {
        "idem_key": idem_key,
        "target": target.value,
        "sources": dialect.statuses(decision_sources(target) if sources is None else sources),
        "terminal": target.is_terminal,
        **dialect.error(error),
        "decided": decision is not None,
        "decided_by": decision.by if decision is not None else None,
        "decision_note": decision.note if decision is not None else None,
    }


def mark_started_params(effect_id: str, *, attempt: int, worker: str) -> dict[str, object]:
    """For mark_started (``processing`` at ``attempt``: its handler starts under park)."""
    return {
        "id": effect_id,
        "attempt": attempt,
        "processing": _PROCESSING,
        "worker": storable_text(worker),
    }


def park_params(
    dialect: Dialect, idem_key: str, *, stale_after_ms: int, error: EffectError
) -> dict[str, object]:
    """For the park compare-and-set: ``processing``, its handler recorded as started
    at the current attempt, and silent for the longer of the holder's lease and
    ``stale_after_ms`` -> ``requires_approval`` with ``error`` as the reason."""
    return {
        "idem_key": idem_key,
        "processing": _PROCESSING,
        "requires_approval": _REQUIRES_APPROVAL,
        "stale_ms": stale_after_ms,
        "kind": PARKED,
        **dialect.error(error),
    }


def settle_params(
    dialect: Dialect,
    idem_key: str,
    *,
    target: EffectStatus,
    expected_attempt: int | None,
    only_parked: bool,
    result_json: str | None,
    error: EffectError | None,
    decision: Decision,
) -> dict[str, object]:
    """For the settle compare-and-set: ``requires_approval`` (at ``expected_attempt``
    when given; parked only, with ``only_parked``) -> ``target``."""
    return {
        "idem_key": idem_key,
        "requires_approval": _REQUIRES_APPROVAL,
        "target": target.value,
        "expected_attempt": expected_attempt,
        "only_parked": only_parked,
        "ambiguous": str(ErrorCode.AMBIGUOUS_ATTEMPT),
        "result": result_json,
        "terminal": target.is_terminal,
        # Approving a parked effect runs it again with a fresh set of tries (as
        # a reopen does): the tries the dead attempt used up are not this run's.
        "fresh_tries": target is EffectStatus.READY,
        # Past the request's deadline (by the store's clock) only a denial settles.
        "ignores_deadline": target is EffectStatus.DENIED,
        "kind": SETTLED,
        **dialect.error(error),
        "decided_by": decision.by,
        "decision_note": decision.note,
    }


#: The list filters, in the order their fragments are joined; each dialect's
#: ``LIST_FILTERS`` maps these names to its SQL.
LIST_FILTER_NAMES: Final = (
    "workflow_id", "tool", "status", "since", "until", "before", "idem_key_prefix",
    "call_id", "error_code", "min_duration", "max_duration",
)  # fmt: skip


def list_params(dialect: Dialect, query: EffectQuery) -> tuple[list[str], dict[str, object]]:
    """The filters ``query`` uses (names from ``LIST_FILTER_NAMES``) and their parameters.

    Only filters the caller gave are returned, so the store joins only those
    fixed fragments (never caller text) and each combination can use its index.
    """
    params: dict[str, object] = {"limit": query.limit}
    names: list[str] = []
    for name in ("workflow_id", "tool", "idem_key_prefix", "call_id", "error_code"):
        value = getattr(query, name)
        if value is not None:
            names.append(name)
            params[name] = value
    if query.status is not None:
        names.append("status")
        params["status"] = query.status.value
    for name in ("since", "until"):
        moment = getattr(query, name)
        if moment is not None:
            names.append(name)
            params[name] = dialect.moment(moment)
    for name in ("min_duration", "max_duration"):
        span = getattr(query, name)
        if span is not None:
            # Whole microseconds, the finest step every store keeps.
            names.append(name)
            params[name + "_us"] = span // timedelta(microseconds=1)
            # The statuses HANDLER_TIME tells apart, from EffectStatus as everywhere.
            params["processing"] = _PROCESSING
            params["run_ends"] = dialect.statuses(RUN_ENDS)
    if query.before is not None:
        names.append("before")
        params["before_at"], params["before_id"] = dialect.moment(query.before[0]), query.before[1]
    names.sort(key=LIST_FILTER_NAMES.index)
    return names, params


def retry_failed_params(
    dialect: Dialect, idem_key: str, *, attempt: int, lease_ms: int
) -> dict[str, object]:
    """For ``retry_failed``: ``failed`` at ``attempt`` -> ``processing``, with the new
    holder's lease."""
    return {
        "idem_key": idem_key,
        "attempt": attempt,
        "lease_ms": lease_ms,
        "failed": EffectStatus.FAILED.value,
        "processing": _PROCESSING,
    }
