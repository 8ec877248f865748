"""Sagas for people and programs: the ``agent-ledger sagas`` views.

``render_saga`` draws one saga the way saga-agent's report does: its status,
then each step with its forward status, its error, its compensation's status
and key, and when each happened. Everything comes from the store, and every
stored string is printed through ``receipt.visible`` (ids, owners, tool names
and error messages are chosen by agents and could carry terminal controls).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

import orjson

from agent_ledger.effects import Effect, JSONValue
from agent_ledger.receipt import visible
from agent_ledger.sagas._outcome import SagaOutcome, StepOutcome
from agent_ledger.stores.saga_base import SagaRecord

_MISSING: Final = "-"


def _when(moment: datetime | None) -> str:
    return _MISSING if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="milliseconds")


def sagas_table(
    sagas: Sequence[SagaRecord], waiting: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """One aligned line per saga, newest first as given; ``waiting`` names, by saga
    id, the parked steps a saga waits for a person on."""
    if not sagas:
        return ["no sagas"]
    waiting = waiting or {}
    headers = ("CREATED (UTC)", "STATUS", "SAGA", "ATT", "OWNER", "HEARTBEAT (UTC)", "WAITING ON")
    rows = [
        (_when(s.created_at), s.status.value, visible(s.saga_id), str(s.attempt),
         visible(s.owner or _MISSING),
         _when(s.heartbeat_at) if not s.status.is_terminal else _MISSING,
         visible("parked " + ", ".join(waiting[s.saga_id])) if waiting.get(s.saga_id) else "")
        for s in sagas
    ]  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]


def _effect_line(effect: Effect | None, what: str) -> str:
    if effect is None:
        return f"{what} {_MISSING}"
    if effect.parked:
        return (
            f"{what} parked: attempt {effect.attempt}'s outcome is unknown; settle it with "
            f"`agent-ledger resolve|approve|deny {effect.idem_key[:12]}`"
        )
    ended = f" at {_when(effect.completed_at)}" if effect.completed_at is not None else ""
    tries = f", {effect.tries} tries" if effect.tries > 1 else ""
    return f"{what} {effect.status.value}{tries}{ended}"


def _step_lines(step: StepOutcome) -> list[str]:
    row = step.step
    lines = [
        f"  [{row.position}] group {row.group_index}  {visible(row.tool)}"
        f"  key {visible(row.idem_key[:12])}"
    ]
    lines.append("      " + _effect_line(step.forward, "forward"))
    if step.forward is not None and step.forward.error is not None:
        lines.append(f"      error  {visible(step.forward.error.message)}")
    if row.compensation is None:
        lines.append("      undo   none (no compensation tool)")
        return lines
    key = visible(row.compensation_key[:12]) if row.compensation_key else _MISSING
    undo = _effect_line(step.compensation, f"undo   {visible(row.compensation)}")
    lines.append(f"      {undo}  key {key}")
    if step.compensation is not None:
        if step.compensation.error is not None:
            lines.append(f"      error  {visible(step.compensation.error.message)}")
        if step.compensation.result is not None:
            receipt = orjson.dumps(step.compensation.result).decode()
            lines.append(f"      receipt {visible(receipt)}")
    return lines


def render_saga(outcome: SagaOutcome) -> str:
    """The saga and each of its steps, for a person."""
    lines = [
        f"saga {visible(outcome.saga_id)}: {outcome.status.value}",
        f"  owner {visible(outcome.owner or _MISSING)}, attempt {outcome.attempt}",
        f"  created {_when(outcome.created_at)}, finished {_when(outcome.completed_at)}",
    ]
    if outcome.error is not None:
        lines.append(f"  why    {visible(outcome.error.message)}")
    if outcome.parked:
        lines.append(f"  waits for a person: parked {visible(', '.join(outcome.parked))}")
    if not outcome.steps:
        lines.append("  no steps")
    for step in outcome.steps:
        lines.extend(_step_lines(step))
    return "\n".join(lines)


def _saga_identity(saga: SagaRecord | SagaOutcome) -> dict[str, JSONValue]:
    """The fields every JSON record of a saga starts with, in this order."""
    return {
        "saga_id": saga.saga_id,
        "status": saga.status.value,
        "attempt": saga.attempt,
        "owner": saga.owner,
    }


def saga_to_record(saga: SagaRecord) -> dict[str, JSONValue]:
    return {
        **_saga_identity(saga),
        "lease_ms": saga.lease_ms,
        "heartbeat_at": _iso(saga.heartbeat_at),
        "abandon_after_ms": saga.abandon_after_ms,
        "on_compensation_failure": saga.on_compensation_failure,
        "error": None
        if saga.error is None
        else {"message": saga.error.message, "code": saga.error.code},
        "created_at": _iso(saga.created_at),
        "updated_at": _iso(saga.updated_at),
        "completed_at": _iso(saga.completed_at),
    }


def _effect_record(effect: Effect | None) -> dict[str, JSONValue] | None:
    if effect is None:
        return None
    return {
        "idem_key": effect.idem_key,
        "status": effect.status.value,
        "tries": effect.tries,
        "error": None if effect.error is None else effect.error.message,
        "result": effect.result,
        "completed_at": _iso(effect.completed_at),
    }


def outcome_to_record(outcome: SagaOutcome) -> dict[str, JSONValue]:
    return {
        **_saga_identity(outcome),
        "error": None if outcome.error is None else outcome.error.message,
        "created_at": _iso(outcome.created_at),
        "completed_at": _iso(outcome.completed_at),
        "parked": list(outcome.parked),
        "steps": [
            {
                "position": s.position,
                "group": s.step.group_index,
                "tool": s.tool,
                "compensation": s.step.compensation,
                "forward": _effect_record(s.forward),
                "undo": _effect_record(s.compensation),
            }
            for s in outcome.steps
        ],
    }
