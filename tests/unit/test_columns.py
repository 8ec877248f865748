"""The effect's fields are listed once; every row, select list and export follows."""

from __future__ import annotations

import dataclasses
import typing
from datetime import UTC, datetime

import orjson

from agent_ledger.effects import (
    Effect,
    EffectError,
    Parked,
    Reopening,
    Settlement,
    TryFailure,
    Usage,
    event_to_dict,
    usage_to_json,
)
from agent_ledger.fields import EFFECT_FIELDS, ERROR_PARTS, TIME_FIELDS
from agent_ledger.receipt import RECORD_FIELDS, effect_from_record, effect_to_record
from agent_ledger.status import EffectStatus
from agent_ledger.stores import _postgres_queries as pg
from agent_ledger.stores import _sqlite_queries as sqlite_queries
from agent_ledger.stores import memory
from agent_ledger.stores._columns import ROW_COLUMNS
from agent_ledger.stores._rows import EFFECT_WIDTH, effect_from_row

AT = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
FULL = Effect(
    id="0b0e4f5e-1111-4222-8333-444455556666",
    idem_key="ab" * 32,
    workflow_id="wf",
    call_id="call-1",
    tool="t",
    status=EffectStatus.DENIED,
    args_canonical='{"a":1}',
    resource_id_canonical='{"r":2}',
    result={"x": [1, 2]},
    error=EffectError("no", "denied"),
    dedup_count=3,
    attempt=2,
    created_at=AT,
    updated_at=AT,
    completed_at=AT,
    heartbeat_at=AT,
    decided_by="ana",
    decision_note="note",
    decided_at=AT,
    started_at=AT,
    executions=1,
    lease_ms=900,
    tries=2,
    history=(
        TryFailure(1, 1, "timed out", "TimeoutError", "TimeoutError", AT),
        Reopening(EffectStatus.FAILED, EffectError("boom", "E"), 3, "ops", "fixed", AT),
        Parked(1, AT, "host:42", AT, AT),
        Settlement(EffectStatus.DENIED, 2, "ana", "not charged", AT),
    ),
    usage=Usage(input_tokens=120, output_tokens=45, cost_usd=0.0031),
    park_attempt=1,
    worker="host:42",
)


def test_the_one_tuple_is_the_effects_fields_in_order() -> None:
    """Adding a field to Effect without adding it to EFFECT_FIELDS fails here."""
    assert tuple(f.name for f in dataclasses.fields(Effect)) == EFFECT_FIELDS


def test_time_fields_are_exactly_the_datetimes() -> None:
    hints = typing.get_type_hints(Effect)
    moments = {name for name, hint in hints.items() if datetime in (hint, *typing.get_args(hint))}
    assert moments == TIME_FIELDS


def test_a_row_is_the_fields_with_the_error_in_two_parts() -> None:
    i = EFFECT_FIELDS.index("error")
    assert (*EFFECT_FIELDS[:i], *ERROR_PARTS, *EFFECT_FIELDS[i + 1 :]) == ROW_COLUMNS
    assert len(EFFECT_FIELDS) + 1 == EFFECT_WIDTH


def test_select_lists_are_derived_per_dialect() -> None:
    """Byte for byte the select lists the stores have always sent."""
    assert pg.EFFECT_COLUMNS == (
        "id::text AS id, idem_key, workflow_id, call_id, tool, status, args_canonical, "
        "resource_id_canonical, result::text AS result, error->>'message' AS error_message, "
        "error->>'code' AS error_code, dedup_count, attempt, created_at, updated_at, "
        "completed_at, heartbeat_at, decided_by, decision_note, decided_at, "
        # Schema version 2 appended its columns.
        "started_at, executions, lease_ms, tries, history::text AS history, "
        # Schema version 3 appended usage, then the ambiguous attempt's two.
        "usage::text AS usage, park_attempt, worker"
    )
    assert sqlite_queries.EFFECT_COLUMNS == (
        "id, idem_key, workflow_id, call_id, tool, status, args_canonical, "
        "resource_id_canonical, result, error_message, error_code, dedup_count, attempt, "
        "created_us, updated_us, completed_us, heartbeat_us, decided_by, decision_note, "
        "decided_us, started_us, executions, lease_ms, tries, history, usage, park_attempt, worker"
    )


def test_effect_from_row_reads_every_field() -> None:
    stored = {
        "status": "denied",
        "result": '{"x": [1, 2]}',
        "error_message": "no",
        "error_code": "denied",
        "history": orjson.dumps([event_to_dict(e) for e in FULL.history]).decode(),
        "usage": usage_to_json(FULL.usage),
    }
    row = tuple(stored.get(name) or getattr(FULL, name) for name in ROW_COLUMNS)
    assert effect_from_row((*row, True), lambda moment: moment) == FULL


def test_memory_rows_keep_every_field() -> None:
    """MemoryStore's row has a slot per field (the result kept as JSON text)."""
    assert tuple("result" if s == "result_json" else s for s in memory._Row.__slots__) == (
        EFFECT_FIELDS
    )


def test_export_format_is_unchanged() -> None:
    """CSV header order and JSON keys are a released format: they never move."""
    assert RECORD_FIELDS == (
        "id", "idem_key", "workflow_id", "call_id", "tool", "status", "attempt",
        "dedup_count", "args", "resource", "result", "error_message", "error_code",
        "created_at", "updated_at", "completed_at", "heartbeat_at", "decided_by",
        "decision_note", "decided_at",
        # Added with schema version 2, after every column that was there before.
        "started_at", "executions", "lease_ms", "tries", "history",
        # Added with schema version 3, after those.
        "usage", "park_attempt", "worker",
    )  # fmt: skip
    record = effect_to_record(FULL)
    assert tuple(record) == RECORD_FIELDS
    assert record["args"] == {"a": 1} and record["resource"] == {"r": 2}
    assert record["created_at"] == AT.isoformat() and record["status"] == "denied"


def test_every_field_survives_an_export_round_trip() -> None:
    """A field added to Effect but forgotten by the export would not come back."""
    assert effect_from_record(effect_to_record(FULL)) == FULL
