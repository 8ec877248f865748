"""How an effect is shown to people and handed to other programs.

``render_receipt`` is the human view; ``effect_to_record`` and
``effect_from_record`` are the lossless machine view used by ``--json`` and
``export`` (they round-trip: ``effect_from_record(effect_to_record(e)) == e``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Final

import orjson

from agent_ledger.effects import (
    Effect,
    EffectError,
    HistoryEvent,
    JSONValue,
    Parked,
    Reopening,
    RetryableFailure,
    Scoped,
    Settlement,
    TryFailure,
    Usage,
    event_from_dict,
    event_to_dict,
    handler_time,
)
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.fields import EFFECT_FIELDS, ERROR_PARTS, TIME_FIELDS
from agent_ledger.status import EffectStatus

# The export is the effect's fields (stores/_columns.py) with three changes,
# all part of the released format, so CSV headers and JSON keys never move:
# args and resource are named for what they hold (decoded JSON, not text),
# the error is written as its message and code, and the two counters come
# right after the status, attempt first.
_EXPORT_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "args_canonical": ("args",),
    "resource_id_canonical": ("resource",),
    "error": ERROR_PARTS,
}
_COUNTERS: Final = ("attempt", "dedup_count")


def _record_fields() -> tuple[str, ...]:
    order = [name for name in EFFECT_FIELDS if name not in _COUNTERS]
    after_status = order.index("status") + 1
    order[after_status:after_status] = _COUNTERS
    return tuple(part for name in order for part in _EXPORT_NAMES.get(name, (name,)))


#: The fields of an exported record, in column order (CSV uses them as its header).
RECORD_FIELDS: Final = _record_fields()
_TIMES: Final = tuple(name for name in RECORD_FIELDS if name in TIME_FIELDS)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _time_encoder(name: str) -> Callable[[Effect], JSONValue]:
    return lambda effect: _iso(getattr(effect, name))


# How each record value is read from an effect, where it is not the field as-is.
_ENCODERS: Final[Mapping[str, Callable[[Effect], JSONValue]]] = {
    "status": lambda effect: effect.status.value,
    "args": lambda effect: effect.args,
    "resource": lambda effect: effect.resource,
    "error_message": lambda effect: None if effect.error is None else effect.error.message,
    "error_code": lambda effect: None if effect.error is None else effect.error.code,
    "history": lambda effect: [event_to_dict(event) for event in effect.history],
    "usage": lambda effect: None if effect.usage is None else effect.usage.to_json(),
    **{name: _time_encoder(name) for name in _TIMES},
}


def effect_to_record(effect: Effect) -> dict[str, JSONValue]:
    """A JSON-ready dict of every field; args and resource decoded, times in ISO 8601."""
    return {
        name: encode(effect) if (encode := _ENCODERS.get(name)) else getattr(effect, name)
        for name in RECORD_FIELDS
    }


def effect_from_record(record: Mapping[str, object]) -> Effect:
    """The inverse of ``effect_to_record`` (for tools that read an export back)."""
    times = {name: _parse_time(record, name) for name in _TIMES if name in record}
    message = record["error_message"]
    resource = record["resource"]
    created_at = _required(times.get("created_at"), "created_at")
    updated_at = _required(times.get("updated_at"), "updated_at")
    heartbeat_at = _required(times.get("heartbeat_at"), "heartbeat_at")
    return Effect(
        id=str(record["id"]),
        idem_key=str(record["idem_key"]),
        workflow_id=str(record["workflow_id"]),
        call_id=None if record["call_id"] is None else str(record["call_id"]),
        tool=str(record["tool"]),
        status=EffectStatus(str(record["status"])),
        args_canonical=orjson.dumps(record["args"], option=orjson.OPT_SORT_KEYS).decode(),
        resource_id_canonical=(
            None
            if resource is None
            else orjson.dumps(resource, option=orjson.OPT_SORT_KEYS).decode()
        ),
        result=record["result"],  # type: ignore[arg-type]
        error=(
            None
            if message is None
            else EffectError(
                str(message), None if record["error_code"] is None else str(record["error_code"])
            )
        ),
        dedup_count=int(str(record["dedup_count"])),
        attempt=int(str(record["attempt"])),
        created_at=created_at,
        updated_at=updated_at,
        completed_at=times.get("completed_at"),
        heartbeat_at=heartbeat_at,
        decided_by=None if record["decided_by"] is None else str(record["decided_by"]),
        decision_note=None if record["decision_note"] is None else str(record["decision_note"]),
        decided_at=times.get("decided_at"),
        # Exports written before schema version 2 lack the last five fields.
        started_at=times.get("started_at"),
        executions=_count(record, "executions"),
        lease_ms=_count(record, "lease_ms"),
        tries=_count(record, "tries"),
        history=_history(record),
        # Exports written before schema version 3 have no usage, park_attempt or worker.
        usage=_usage(record),
        park_attempt=_optional_count(record, "park_attempt"),
        worker=str(record["worker"]) if record.get("worker") not in (None, "") else None,
    )


def _usage(record: Mapping[str, object]) -> Usage | None:
    value = record.get("usage")
    return None if value is None else Usage.from_json(value)


def _optional_count(record: Mapping[str, object], name: str) -> int | None:
    value = record.get(name)
    if value is None or value == "":  # CSV writes None as an empty cell
        return None
    return _count(record, name)


def _history(record: Mapping[str, object]) -> tuple[HistoryEvent, ...]:
    value = record.get("history", [])
    if isinstance(value, str):  # CSV cells are JSON text
        value = orjson.loads(value)
    if not isinstance(value, list):
        raise EffectLedgerValidationError(
            f"history must be a list of events, got {value!r}", field="history"
        )
    try:
        return tuple(event_from_dict(item) for item in value)
    except (KeyError, TypeError, ValueError) as exc:
        raise EffectLedgerValidationError(
            f"history holds an event that cannot be read ({exc!r})", field="history"
        ) from None


def _count(record: Mapping[str, object], name: str) -> int:
    value = record.get(name, 0)
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():  # CSV cells are text
        return int(value)
    raise EffectLedgerValidationError(
        f"{name} must be a count (an int >= 0), got {value!r}", field=name
    )


def _parse_time(record: Mapping[str, object], name: str) -> datetime | None:
    value = record[name]
    if value is None:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        raise EffectLedgerValidationError(
            f"{name} is not an ISO 8601 time: {value!r}", field=name
        ) from None


def _required(moment: datetime | None, name: str) -> datetime:
    if moment is None:
        raise EffectLedgerValidationError(f"a record needs {name}", field=name)
    return moment


#: Characters a terminal acts on instead of showing: the C0 controls (newline
#: and tab too, since every value is shown on one line), DEL, the C1 controls
#: U+0080-U+009F (U+009B alone is CSI, as ESC [ is), and, among the rest,
#: every format character (Unicode category Cf, see ``_escape``): the
#: bidirectional marks, embeddings, overrides and isolates, which reorder
#: what follows them, and the zero-width ones (U+200B, U+2060, U+FEFF...),
#: which make two different ids print the same.
_UNSAFE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]|[^\x00-\x7f]")


def visible(text: str) -> str:
    """``text`` on one line with every unsafe character written as an escape
    (``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\u200b``).

    Agents choose tool names, args and ids, and people write notes and names;
    printed raw, any of them could clear a reviewer's screen, recolour it,
    rewrite the line above, reverse the text after it, or hide inside an id
    that then looks like another, so what a person reads would not be what
    was asked. Everything that shows stored text on a terminal (``show``,
    ``list``, ``review``, ``sagas``) goes through this function.
    """
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code >= 0xA0 and unicodedata.category(char) != "Cf":
        return char  # any other non-ASCII character (accents, CJK, emoji) prints as it is
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _handler_time_rows(effect: Effect) -> list[tuple[str, str]]:
    """How long the handler ran (``handler_time``: never the wait for a person).

    A run a person settled or canceled after it started has no known end:
    from its start to the decision is a worker's silence plus a person's
    wait, and showing it as the handler's time would mislead.
    """
    if effect.started_at is None:
        return []
    took = handler_time(effect, datetime.now(UTC))
    if took is not None:
        running = " so far" if effect.status is EffectStatus.PROCESSING else ""
        return [("handler time", _elapsed(took) + running)]
    if effect.decided_at is not None and effect.decided_at > effect.started_at:
        return [("handler time", "unknown: a person decided after the run started")]
    return []


def render_receipt(effect: Effect) -> str:
    """A multi-line, aligned description of one effect, for terminals and logs.

    What a reader would otherwise misread is spelled out: an effect with no
    outcome yet says ``pending`` (not ``null``, which is what a handler that
    returned None left); ``executions`` counts handler runs (the attempt is
    the fencing token, and an approval adds one without running anything);
    the handler time excludes any wait for a person, which is shown apart. An
    effect that was retried or reopened shows its tries and every earlier
    try's error and reopening, oldest first; one that ran once in one try
    does not repeat that it tried once.
    """
    rows = [
        ("effect", effect.id),
        ("idem key", effect.idem_key),
        ("workflow", effect.workflow_id),
        ("tool", effect.tool),
        ("call id", effect.call_id or "-"),
        ("status", effect.status.value),
        ("args", effect.args_canonical),
        ("resource", effect.resource_id_canonical or "-"),
        ("outcome", _outcome(effect)),
        ("executions", str(effect.executions)),
        ("fencing token", f"attempt {effect.attempt}"),
        ("duplicates", str(effect.dedup_count)),
        ("created", _stamp(effect.created_at)),
    ]
    if effect.decided_at is not None:
        decision = f"{_decision_kind(effect)} by {effect.decided_by or 'someone unnamed'}"
        if effect.decision_note:
            decision += f": {effect.decision_note}"
        rows += [("decision", decision), ("decided", _stamp(effect.decided_at))]
        if _decision_kind(effect) == "approved":
            rows.append(("approval wait", _elapsed(effect.decided_at - effect.created_at)))
    rows += [("started", _stamp(effect.started_at)), ("completed", _stamp(effect.completed_at))]
    rows += _handler_time_rows(effect)
    if effect.tries > 1 or any(isinstance(e, TryFailure | Reopening) for e in effect.history):
        rows.append(("tries", str(effect.tries)))
    rows += [_history_row(event) for event in effect.history]
    if effect.usage is not None:
        usage = effect.usage
        cost = "price unknown" if usage.cost_usd is None else f"${usage.cost_usd:.6f}"
        rows.append(
            ("usage", f"{usage.input_tokens} in / {usage.output_tokens} out tokens, {cost}")
        )
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.rjust(width)}  {visible(value)}" for label, value in rows)


def _outcome(effect: Effect) -> str:
    if not effect.status.is_terminal:
        return "pending"
    if effect.error is not None:
        return f"error: {effect.error}"
    return orjson.dumps(effect.result).decode()


def _elapsed(span: timedelta) -> str:
    seconds = max(span.total_seconds(), 0.0)
    if seconds < 1.0:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120.0:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def _history_row(event: HistoryEvent) -> tuple[str, str]:
    if isinstance(event, Parked):
        ran = f"started {_stamp(event.started_at)} by {event.worker or 'an unnamed worker'}"
        return (
            "parked",
            f"{_stamp(event.at)}: attempt {event.attempt} ({ran}) went silent after "
            f"{_stamp(event.heartbeat_at)}; outcome unknown",
        )
    if isinstance(event, Settlement):
        note = f": {event.note}" if event.note else ""
        who = event.by or "someone unnamed"
        return (
            _SETTLED_AS.get(event.status, event.status.value),
            f"{_stamp(event.at)} by {who} (attempt {event.attempt}){note}",
        )
    if isinstance(event, TryFailure):
        error = EffectError(event.message, event.code)
        return (f"try {event.number}", f"{_stamp(event.at)} failed: {error} ({event.type})")
    if isinstance(event, Scoped):
        ids = [f"turn {event.turn}"] if event.turn is not None else []
        ids += [f"call {event.call_id}"] if event.call_id is not None else []
        return ("scope", f"{event.scope}" + (f" ({', '.join(ids)})" if ids else ""))
    if isinstance(event, RetryableFailure):
        error = EffectError(event.message, event.code)
        return (
            "retryable",
            f"{_stamp(event.at)} attempt {event.attempt} failed: {error}; the next call runs "
            "it again",
        )
    was = event.status.value + (f" ({event.error})" if event.error is not None else "")
    tries = (
        "" if event.tries == 0 else f", after {event.tries} tr{'y' if event.tries == 1 else 'ies'}"
    )
    return ("reopened", f"{_stamp(event.at)} by {event.by}: {event.reason}; was {was}{tries}")


#: How a settlement reads in a receipt's history.
_SETTLED_AS: Final = {
    EffectStatus.READY: "approved",
    EffectStatus.DENIED: "denied",
    EffectStatus.SUCCEEDED: "resolved",
    EffectStatus.FAILED: "resolved failed",
}


def _decision_kind(effect: Effect) -> str:
    # Decisions are made by approve, deny, resolve, cancel and reopen. A
    # denial or a cancellation ends the effect, so its status tells; a
    # reopening or a settlement is in the history, at the decision's own
    # time; any other decision was an approval.
    if effect.status in (EffectStatus.DENIED, EffectStatus.CANCELED):
        return effect.status.value
    last = effect.history[-1] if effect.history else None
    if isinstance(last, Reopening) and last.at == effect.decided_at:
        return "reopened"
    if isinstance(last, Settlement) and last.at == effect.decided_at:
        return _SETTLED_AS.get(last.status, "approved")
    return "approved"


def _stamp(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(timespec="milliseconds")
