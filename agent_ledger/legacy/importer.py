"""Bring every receipt of an agent-ledger 0.2.x table into this ledger.

A 0.2.x row keeps its workflow id, tool, canonical args and resource, so the
call can be rebuilt and keyed the way this version keys it (``v1``, see
``agent_ledger.keys``). Which of 0.2.x's three identities the call used
(resource, a subset of its args, all its args) is not stored; it is found by
recomputing 0.2.x's key each way until one equals the stored key, so a call
made with ``idempotency_keys`` is recognised too (the subset is searched).

Rules (docs/migrating-from-0.2.md explains them to users):

* status, result, error, dedup count, call id and timestamps are kept; the
  0.2.x id becomes the effect's id, which is what makes a second import
  idempotent (an effect with that id and that key is already there);
* on a second import such an effect is brought up to 0.2.x's current state
  if nobody here has touched it since, by a compare-and-set; changed on
  both sides, it is kept and reported as a conflict (``_reconcile``);
* the result is copied as the JSON text PostgreSQL kept, never decoded and
  re-encoded, so its floats are what 0.2.x itself would replay; an integer
  literal beyond 64 bits in it replays as a float here (orjson), so such
  rows are imported and listed as ``inexact_results``;
* ``processing`` comes across held by nobody: its heartbeat is 0.2.x's last
  ``updated_at`` and its lease the default stale window, so a caller takes it
  over once that has passed; ``requires_approval`` stays waiting for a
  decision, ``ready`` stays claimable;
* collisions are reported, never merged: two rows that this version keys
  alike (neither is written), a row whose key the target already holds under
  another id (the target's effect is kept), and a row whose 0.2.x key
  another call could have produced (``"|"`` in a workflow id or tool): that
  row is imported for the call that wrote it, and reported, because repeated
  calls counted on it may have been the other call, which 0.2.x answered
  with this receipt without running it;
* everything is written in one transaction: any failure leaves the target
  as it was;
* each imported row's 0.2.x key is recorded in ``agent_ledger_legacy_keys``
  (rows a previous run imported too), for ``legacy_keys=True``.

Where its SQL lives: the statement it shares with the stores (recording a
0.2.x key, ``RECORD_LEGACY``) is in ``stores/_postgres_queries.py`` and
``stores/_sqlite_queries.py``. The rest stays here on purpose: it reads a
foreign table (0.2.x's ``effects``, whose layout only this module knows)
and writes every column of an effect at once, bypassing the state machine
the stores' statements enforce; next to those statements it would be one
more entry that no store step may use.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import orjson

from agent_ledger.calls import ResourceDescriptor, ToolCall
from agent_ledger.errors import EffectLedgerError, EffectLedgerValidationError, EffectStoreError
from agent_ledger.keys import canonicalize
from agent_ledger.legacy.keys import MAX_SAFE_INTEGER, legacy_key
from agent_ledger.options import DEFAULT_STALE_AFTER_MS
from agent_ledger.status import EffectStatus
from agent_ledger.stores import _postgres_queries as q
from agent_ledger.stores import _sqlite_queries as sq
from agent_ledger.stores.url import split_schema as url_split_schema

if TYPE_CHECKING:
    from psycopg import AsyncConnection

#: 0.2.x's table name (it had no prefix and lived in the connection's search path).
LEGACY_TABLE: Final = "effects"
#: Calls with more top-level args than this are not searched for an
#: ``idempotency_keys`` subset (2**n keys to try).
MAX_SUBSET_SEARCH_ARGS: Final = 16

_LEGACY_COLUMNS: Final = (
    "id::text, idem_key, workflow_id, call_id, tool, status, args_canonical, "
    "resource_id_canonical, result::text, error::text, dedup_count, created_at, "
    "updated_at, completed_at"
)


@dataclass(frozen=True, slots=True)
class LegacyRow:
    """One row of a 0.2.x ``effects`` table, as stored."""

    id: str
    idem_key: str
    workflow_id: str
    call_id: str | None
    tool: str
    status: str
    args_canonical: str
    resource_id_canonical: str
    result_json: str | None
    error_json: str | None
    dedup_count: int
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Planned:
    """A row ready to write: the rebuilt call's v1 key and canonical texts."""

    row: LegacyRow
    idem_key: str
    args_canonical: str
    resource_id_canonical: str | None


@dataclass(slots=True)
class ImportReport:
    """What an import did (or, with ``dry_run``, would do)."""

    source: str
    read: int = 0
    imported: int = 0
    #: Already in the target under the same id and key (a previous import),
    #: and nothing to bring across: unchanged in 0.2.x, or moved on here only.
    skipped: int = 0
    #: Rows a previous import brought in, untouched here since, that 0.2.x has
    #: changed: brought up to 0.2.x's current state (one line each).
    updated: list[str] = field(default_factory=list)
    #: Rows changed on both sides since a previous import (one line each,
    #: naming both states); the target's effect is kept.
    conflicts: list[str] = field(default_factory=list)
    by_status: Counter[str] = field(default_factory=Counter)
    #: One line per collision; see the module doc.
    collisions: list[str] = field(default_factory=list)
    #: Rows whose call could not be rebuilt (not imported), one line each.
    unreadable: list[str] = field(default_factory=list)
    #: Ids of imported effects whose result replays here not as 0.2.x replayed
    #: it (an integer beyond 64 bits comes back a float; see ``result_is_exact``).
    inexact_results: list[str] = field(default_factory=list)
    dry_run: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "read": self.read,
            "imported": self.imported,
            "skipped": self.skipped,
            "updated": list(self.updated),
            "conflicts": list(self.conflicts),
            "collisions": list(self.collisions),
            "unreadable": list(self.unreadable),
            "inexact_results": list(self.inexact_results),
            "by_status": dict(sorted(self.by_status.items())),
            "dry_run": self.dry_run,
        }


# -- rebuilding the call ------------------------------------------------------------


def _parse_int(text: str) -> int | float:
    # 0.2.x wrote integers only within +-(2**53 - 1); longer digit strings were floats.
    number = int(text)
    return number if abs(number) <= MAX_SAFE_INTEGER else float(text)


def _loads(text: str) -> Any:
    return json.loads(text, parse_int=_parse_int)


def _resource_candidates(text: str) -> list[ResourceDescriptor]:
    """Every ``NAMESPACE/TYPE/{id}`` reading of 0.2.x's resource text."""
    found = []
    slashes = [i for i, char in enumerate(text) if char == "/"]
    for first, second in itertools.combinations(slashes, 2):
        namespace, kind, id_text = text[:first], text[first + 1 : second], text[second + 1 :]
        if not (namespace and kind and id_text.startswith("{")):
            continue
        try:
            ident = _loads(id_text)
            if isinstance(ident, dict):
                found.append(ResourceDescriptor(namespace, kind, ident))
        except (ValueError, EffectLedgerError):
            continue
    return found


def rebuild_call(row: LegacyRow) -> ToolCall:
    """The call that wrote ``row``, keyed the way 0.2.x keyed it.

    Raises ``EffectLedgerValidationError`` saying why when no reading of the
    stored texts reproduces the stored key.
    """
    args = _loads(row.args_canonical)
    if not isinstance(args, dict):
        raise EffectLedgerValidationError("args_canonical is not a JSON object", field="args")

    def call(**extra: Any) -> ToolCall:
        return ToolCall(row.workflow_id, row.tool, args, call_id=row.call_id, **extra)

    if legacy_key(row.workflow_id, row.tool, row.args_canonical) == row.idem_key:
        return call()
    resource_text = row.resource_id_canonical
    if legacy_key(row.workflow_id, row.tool, resource_text) == row.idem_key:
        readings = _resource_candidates(resource_text)
        if len(readings) == 1:
            return call(resource=readings[0])
        raise EffectLedgerValidationError(
            f"resource {resource_text!r} reads {len(readings)} ways as namespace/type/id "
            "(a '/' in its namespace or type)",
            field="resource",
        )
    from agent_ledger.legacy.keys import jcs

    names = sorted(args)
    if len(names) <= MAX_SUBSET_SEARCH_ARGS:
        for size in range(1, len(names)):
            for subset in itertools.combinations(names, size):
                text = jcs({name: args[name] for name in subset})
                if legacy_key(row.workflow_id, row.tool, text) == row.idem_key:
                    return call(idempotency_keys=list(subset))
    raise EffectLedgerValidationError(
        "no reading of its workflow, tool, args or resource gives its stored 0.2.x key",
        field="idem_key",
    )


def other_readings(row: LegacyRow) -> list[tuple[str, str]]:
    """Other (workflow, tool) pairs whose 0.2.x key equals this row's ("|" ambiguity)."""
    joined = f"{row.workflow_id}|{row.tool}"
    cuts = [i for i, char in enumerate(joined) if char == "|"]
    pairs = [(joined[:i], joined[i + 1 :]) for i in cuts]
    return [(w, t) for w, t in pairs if w and t and (w, t) != (row.workflow_id, row.tool)]


def plan(rows: Sequence[LegacyRow], report: ImportReport) -> list[Planned]:
    """Rebuild every row's call and drop (reporting) the ones that collide in v1."""
    planned: list[Planned] = []
    for row in rows:
        try:
            EffectStatus(row.status)
            _check_result_decodes(row)
            call = rebuild_call(row)
            canonical = canonicalize(call, max_args_size_bytes=2**62)
        except (ValueError, EffectLedgerError) as exc:
            report.unreadable.append(f"row {row.id} ({row.workflow_id} / {row.tool}): {exc}")
            continue
        for workflow, tool in other_readings(row):
            report.collisions.append(
                f"row {row.id}: 0.2.x gave workflow {workflow!r} tool {tool!r} the same key as "
                f"workflow {row.workflow_id!r} tool {row.tool!r}; imported for the latter "
                f"only ({row.dedup_count} repeated call(s) under 0.2.x may have been the other "
                "call, which then got this receipt and never ran)"
            )
        planned.append(
            Planned(
                row, canonical.idem_key, canonical.args_canonical, canonical.resource_id_canonical
            )
        )
    by_key: dict[str, list[Planned]] = {}
    for item in planned:
        by_key.setdefault(item.idem_key, []).append(item)
    kept = []
    for key, items in by_key.items():
        if len(items) == 1:
            kept.append(items[0])
            continue
        ids = ", ".join(item.row.id for item in items)
        report.collisions.append(
            f"rows {ids} are one call in this version (key {key[:12]}); none imported: "
            "keep one of them in the 0.2.x table and import again"
        )
    return kept


# -- results this ledger cannot replay exactly ----------------------------------------


def _same(ours: Any, theirs: Any) -> bool:
    if type(ours) is not type(theirs):
        return False
    if isinstance(ours, dict):
        return ours.keys() == theirs.keys() and all(_same(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    return bool(ours == theirs)


def result_is_exact(result_json: str | None) -> bool:
    """Does this ledger replay the stored result as 0.2.x did?

    0.2.x decoded its jsonb text with Python's ``json`` (integers of any
    size); the stores here decode with orjson, whose integers end at 64 bits
    (-2**63 .. 2**64-1): a longer integer literal becomes the nearest float.
    That includes floats jsonb normalised to integer literals (``1e20`` is
    stored as ``100000000000000000000``). Decoding only imported results
    exactly would need either a marker in the row or a scan of every result
    on every read, so the import reports such rows instead.
    """
    if result_json is None:
        return True
    return _same(orjson.loads(result_json), json.loads(result_json))


def _check_result_decodes(row: LegacyRow) -> None:
    # An integer literal beyond float range (a Python int 0.2.x stored in
    # jsonb) is not a number orjson can decode: imported, every read of the
    # effect (list, export, its own call) would fail.
    if row.result_json is None:
        return
    try:
        orjson.loads(row.result_json)
    except orjson.JSONDecodeError as exc:
        raise EffectLedgerValidationError(
            f"its result cannot be read here ({exc}); change that number in the 0.2.x "
            "table (a string, say) and import again",
            field="result",
        ) from None


def _note_inexact(items: Sequence[Planned], report: ImportReport) -> None:
    report.inexact_results.extend(
        item.row.id for item in items if not result_is_exact(item.row.result_json)
    )


# -- the effect's columns ------------------------------------------------------------


def _effect_values(item: Planned) -> dict[str, Any]:
    row = item.row
    status = EffectStatus(row.status)
    error = json.loads(row.error_json) if row.error_json else None
    ran = status in (EffectStatus.SUCCEEDED, EffectStatus.FAILED, EffectStatus.PROCESSING)
    decided = status in (EffectStatus.DENIED, EffectStatus.READY, EffectStatus.CANCELED)
    return {
        "id": row.id,
        "idem_key": item.idem_key,
        "workflow_id": row.workflow_id,
        "call_id": row.call_id,
        "tool": row.tool,
        "status": status.value,
        "args_canonical": item.args_canonical,
        "resource_id_canonical": item.resource_id_canonical,
        "result": row.result_json,
        "error_message": error.get("message") if isinstance(error, dict) else None,
        "error_code": error.get("code") if isinstance(error, dict) else None,
        "dedup_count": row.dedup_count,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "completed_at": row.completed_at,
        # 0.2.x had no heartbeat; its last update is the last sign of life.
        "heartbeat_at": row.updated_at,
        "decided_at": row.updated_at if decided else None,
        "lease_ms": DEFAULT_STALE_AFTER_MS,
        # 0.2.x did not count runs: 1 for what ran or runs, like schema 2's estimate.
        "executions": 1 if ran else 0,
        "started_at": (row.updated_at if status is EffectStatus.PROCESSING else row.created_at)
        if ran
        else None,
    }


# -- reading the source ------------------------------------------------------------------


def first_line(exc: BaseException) -> str:
    """The driver's message without the rest: psycopg adds ``LINE 1: ...`` and a
    caret under it, libpq a second "Is the server running...?" line, and the
    CLI promises one line on stderr."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def split_schema(url: str, schema: str | None, *, field: str = "url") -> tuple[str, str]:
    """libpq conninfo and schema: ``--schema``, else the URL's ``?schema=``, else public.

    A malformed URL is an ``EffectLedgerValidationError`` naming ``field``.
    """
    conninfo, in_url = url_split_schema(url, field=field)
    return conninfo, schema or in_url or "public"


async def read_source(url: str, schema: str | None) -> tuple[str, list[LegacyRow]]:
    """Every row of the 0.2.x table, read in one snapshot; and a label for it."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise EffectLedgerValidationError(
            f"--from must be a postgresql:// URL (agent-ledger 0.2.x kept effects only in "
            f"PostgreSQL), got {url!r}",
            field="from",
        )
    try:
        from psycopg import sql
    except ImportError:
        raise EffectLedgerValidationError(
            'reading a 0.2.x database needs the extra: pip install "agent-ledger[postgres]"',
            field="from",
        ) from None
    conninfo, name = split_schema(url, schema, field="from")
    label = f'"{name}"."{LEGACY_TABLE}"'
    async with _transaction(
        conninfo, to="the 0.2.x database", failed=f"cannot read {label}"
    ) as conn:
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        found = await conn.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s AND column_name = ANY(%s)",
            (name, LEGACY_TABLE, ["idem_key", "args_canonical", "resource_id_canonical"]),
        )
        count = await found.fetchone()
        if count is None or count[0] != 3:
            raise EffectLedgerValidationError(
                f"no agent-ledger 0.2.x table {label} there (pass --schema if it lives in "
                "another schema)",
                field="from",
            )
        query = sql.SQL("SELECT " + _LEGACY_COLUMNS + " FROM {} ORDER BY created_at, id")
        cursor = await conn.execute(query.format(sql.Identifier(name, LEGACY_TABLE)))
        rows = [LegacyRow(*record) for record in await cursor.fetchall()]
    return label, rows


# -- writing the target --------------------------------------------------------------------


_TARGET_COLUMNS: Final = (
    "id", "idem_key", "workflow_id", "call_id", "tool", "status", "args_canonical",
    "resource_id_canonical", "result", "error_message", "error_code", "dedup_count",
    "created_at", "updated_at", "completed_at", "heartbeat_at", "decided_at", "lease_ms",
    "executions", "started_at",
)  # fmt: skip


def _classify(
    items: Sequence[Planned], existing: dict[str, str], report: ImportReport
) -> tuple[list[Planned], list[Planned]]:
    """Split off what the target already holds: same id and key (a previous
    import's, the second list, for ``_reconcile``) or a clash (collision,
    dropped); the first list is to write.

    ``existing`` maps each id and each key the target has, among these rows',
    to the key (for an id) or the id (for a key) it goes with.
    """
    todo, skipped = [], []
    for item in items:
        key_of_id = existing.get("id:" + item.row.id)
        id_of_key = existing.get("key:" + item.idem_key)
        if key_of_id is None and id_of_key is None:
            todo.append(item)
        elif key_of_id == item.idem_key:
            skipped.append(item)
        else:
            report.collisions.append(
                f"row {item.row.id} ({item.row.workflow_id} / {item.row.tool}): the target "
                f"already has {'effect ' + id_of_key if id_of_key else 'this id'} for a "
                "different call or key; kept the target's, not imported"
            )
    return todo, skipped


@dataclass(frozen=True, slots=True)
class TargetState:
    """What a re-import needs of an effect a previous import wrote."""

    status: str
    attempt: int
    #: Times in the target's own form (datetime, or microseconds in SQLite):
    #: only compared with each other and with the source's in that form.
    updated_at: object
    heartbeat_at: object
    decided_by: str | None
    history_json: str | None


def _reopened_here(state: TargetState) -> bool:
    events = json.loads(state.history_json) if state.history_json else []
    return any(isinstance(e, dict) and e.get("kind") == "reopened" for e in events)


def _reconcile(
    present: Sequence[Planned],
    states: dict[str, TargetState],
    source_time: Any,
    report: ImportReport,
) -> list[tuple[Planned, TargetState]]:
    """Decide, for each row a previous import wrote, what this run does with it.

    An import writes ``attempt`` 1 and ``heartbeat_at = updated_at`` = 0.2.x's
    ``updated_at``. Every change this ledger makes to such an effect moves
    one of them: a claim or takeover moves ``attempt`` (and the heartbeat);
    a decision, cancel, reopen or unfenced commit moves ``updated_at`` but
    not the heartbeat (only the holder of a later attempt beats). Only a
    duplicate call's ``dedup_count + 1`` moves neither. So:

    * ``attempt`` 1 and ``heartbeat_at`` equal to 0.2.x's ``updated_at`` now:
      0.2.x has not changed the row since (it moves ``updated_at`` on every
      change, duplicates included): skipped;
    * else, still as imported (``attempt`` 1, ``updated_at = heartbeat_at``,
      nobody decided): brought up to 0.2.x's state (the list returned; the
      UPDATE compares the same columns, so a worker here that changes it
      meanwhile wins and the row becomes a conflict);
    * ``attempt`` 1 but changed here, and changed in 0.2.x: a conflict;
    * claimed here (``attempt`` > 1): 0.2.x's row was ``processing`` or
      ``ready`` then (or failed/canceled, reopened here). If 0.2.x has since
      completed, denied or canceled it, and it was not reopened here, both
      sides went on with the call: a conflict ("ran on both sides" when both
      completed it). Otherwise this ledger's run is the newer state: skipped.
    """
    todo: list[tuple[Planned, TargetState]] = []
    for item in present:
        row, state = item.row, states[item.row.id]
        now = source_time(row.updated_at)
        both = f"0.2.x has it {row.status}, this ledger {state.status}"
        where = f"row {row.id} ({row.workflow_id} / {row.tool})"
        if state.attempt == 1:
            if state.heartbeat_at == now:
                report.skipped += 1
            elif state.updated_at == state.heartbeat_at and state.decided_by is None:
                todo.append((item, state))
            else:
                report.conflicts.append(
                    f"{where}: changed on both sides since it was imported ({both}); "
                    "kept this ledger's"
                )
            continue
        if row.status in _FINISHED_IN_0_2 and not _reopened_here(state):
            if row.status in ("succeeded", "failed") and state.status in ("succeeded", "failed"):
                what = "ran on both sides"
            else:
                what = "went on on both sides"
            report.conflicts.append(
                f"{where}: {what} since it was imported ({both}, after a run here); "
                "kept this ledger's"
            )
        else:
            report.skipped += 1
    return todo


#: 0.2.x statuses that end a call; one reached after a claim here is a conflict.
_FINISHED_IN_0_2: Final = ("succeeded", "failed", "denied", "canceled")

#: The columns a re-import brings up to 0.2.x's current state.
_UPDATED_COLUMNS: Final = (
    "status", "result", "error_message", "error_code", "updated_at", "completed_at",
    "heartbeat_at", "decided_at", "lease_ms", "executions", "started_at",
)  # fmt: skip


def _updated(item: Planned, state: TargetState, report: ImportReport) -> None:
    row = item.row
    report.updated.append(
        f"row {row.id} ({row.workflow_id} / {row.tool}): {state.status} -> {row.status}"
    )


def _lost_race(item: Planned, report: ImportReport) -> None:
    row = item.row
    report.conflicts.append(
        f"row {row.id} ({row.workflow_id} / {row.tool}): changed here during the import "
        f"(0.2.x has it {row.status}); kept this ledger's"
    )


def _error_json(values: dict[str, Any]) -> str | None:
    if values["error_message"] is None:
        return None
    return json.dumps({"message": values["error_message"], "code": values["error_code"]})


async def write_postgres(
    url: str, items: Sequence[Planned], report: ImportReport, *, dry_run: bool
) -> None:
    from psycopg import sql

    conninfo, schema = split_schema(url, None)
    table = sql.Identifier(schema, "agent_ledger_effects")
    async with _transaction(conninfo, to="the target", failed="nothing written") as conn:
        # One import at a time per target schema; live workers are not blocked.
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", ("agent-ledger import " + schema,)
        )
        cursor = await conn.execute(
            sql.SQL(
                "SELECT id::text, idem_key FROM {} WHERE id::text = ANY(%s) OR idem_key = ANY(%s)"
            ).format(table),
            ([i.row.id for i in items], [i.idem_key for i in items]),
        )
        existing: dict[str, str] = {}
        for effect_id, key in await cursor.fetchall():
            existing["id:" + effect_id] = key
            existing["key:" + key] = effect_id
        todo, mapped = _classify(items, existing, report)
        state_cursor = await conn.execute(
            sql.SQL(
                "SELECT id::text, status, attempt, updated_at, heartbeat_at, decided_by, "
                "history::text FROM {} WHERE id::text = ANY(%s)"
            ).format(table),
            ([i.row.id for i in mapped],),
        )
        states = {
            effect_id: TargetState(*rest) for effect_id, *rest in await state_cursor.fetchall()
        }
        changes = _reconcile(mapped, states, lambda moment: moment, report)
        if dry_run:
            _count(todo, report)
            for item, state in changes:
                _updated(item, state, report)
            _note_inexact([*todo, *mapped], report)
            return
        update = sql.SQL(
            "UPDATE {} SET status = %(status)s, result = %(result)s::json, "
            "error = %(error)s::jsonb, dedup_count = greatest(dedup_count, %(dedup_count)s), "
            "updated_at = %(updated_at)s, completed_at = %(completed_at)s, "
            "heartbeat_at = %(heartbeat_at)s, decided_at = %(decided_at)s, "
            "lease_ms = %(lease_ms)s, executions = %(executions)s, "
            "started_at = %(started_at)s "
            # Compare-and-set: still exactly as read (and as an import leaves it).
            "WHERE id = %(id)s AND attempt = 1 AND status = %(was_status)s "
            "AND updated_at = %(was_updated_at)s AND heartbeat_at = %(was_heartbeat_at)s "
            "AND decided_by IS NULL RETURNING id"
        ).format(table)
        for item, state in changes:
            values = _effect_values(item)
            values["error"] = _error_json(values)
            updated = await conn.execute(
                update,
                {
                    **values,
                    "was_status": state.status,
                    "was_updated_at": state.updated_at,
                    "was_heartbeat_at": state.heartbeat_at,
                },
            )
            if await updated.fetchone() is None:
                _lost_race(item, report)
            else:
                _updated(item, state, report)
        columns = [c for c in _TARGET_COLUMNS if not c.startswith("error_")]
        names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        marks = sql.SQL(", ").join(
            sql.SQL("%s::json") if c == "result" else sql.Placeholder() for c in columns
        )
        insert = sql.SQL(
            "INSERT INTO {} ({}, error, attempt) VALUES ({}, %s::jsonb, 1) "
            "ON CONFLICT DO NOTHING RETURNING id"
        ).format(table, names, marks)
        for item in todo:
            values = _effect_values(item)
            error = _error_json(values)
            row_cursor = await conn.execute(insert, [*(values[c] for c in columns), error])
            if await row_cursor.fetchone() is None:
                report.collisions.append(
                    f"row {item.row.id}: a worker wrote key {item.idem_key[:12]} during the "
                    "import; kept the worker's, not imported"
                )
                continue
            _count([item], report)
            mapped.append(item)
        _note_inexact(mapped, report)
        # 0.2.x's key of each imported effect, for legacy_keys=True (a
        # previous import's rows too, so a second run completes a first).
        record = sql.SQL(q.RECORD_LEGACY).format(
            legacy_keys=sql.Identifier(schema, "agent_ledger_legacy_keys")
        )
        for item in mapped:
            await conn.execute(record, {"legacy_key": item.row.idem_key, "idem_key": item.idem_key})


@asynccontextmanager
async def _transaction(conninfo: str, *, to: str, failed: str) -> AsyncIterator[AsyncConnection]:
    """One transaction on a connection of its own to ``conninfo``, closed after it.

    A driver error is an ``EffectStoreError``: ``cannot connect to {to}``, or
    ``{failed}`` once connected (the transaction rolled back).
    """
    import psycopg

    try:
        conn = await psycopg.AsyncConnection.connect(conninfo, connect_timeout=10)
    except psycopg.Error as exc:
        raise EffectStoreError(
            f"cannot connect to {to}: {first_line(exc)}", operation="import-0.2"
        ) from None
    try:
        async with conn.transaction():
            yield conn
    except psycopg.Error as exc:
        raise EffectStoreError(f"{failed}: {first_line(exc)}", operation="import-0.2") from None
    finally:
        await conn.close()


def _us(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    delta = moment.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def write_sqlite(
    path: str, items: Sequence[Planned], report: ImportReport, *, dry_run: bool
) -> None:
    columns = [c[:-3] + "_us" if c.endswith("_at") else c for c in _TARGET_COLUMNS]
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            existing: dict[str, str] = {}
            for item in items:
                for effect_id, key in conn.execute(
                    "SELECT id, idem_key FROM agent_ledger_effects WHERE id = ? OR idem_key = ?",
                    (item.row.id, item.idem_key),
                ):
                    existing["id:" + effect_id] = key
                    existing["key:" + key] = effect_id
            todo, mapped = _classify(items, existing, report)
            states: dict[str, TargetState] = {}
            for item in mapped:
                for effect_id, *rest in conn.execute(
                    "SELECT id, status, attempt, updated_us, heartbeat_us, decided_by, history "
                    "FROM agent_ledger_effects WHERE id = ?",
                    (item.row.id,),
                ):
                    states[effect_id] = TargetState(*rest)
            changes = _reconcile(mapped, states, _us, report)
            if dry_run:
                for item, state in changes:
                    _updated(item, state, report)
            else:
                update = (
                    "UPDATE agent_ledger_effects SET "
                    + ", ".join(
                        f"{c[:-3]}_us = ?" if c.endswith("_at") else f"{c} = ?"
                        for c in _UPDATED_COLUMNS
                    )
                    + ", dedup_count = max(dedup_count, ?) "
                    # Compare-and-set: still exactly as read (and as an import leaves it).
                    "WHERE id = ? AND attempt = 1 AND status = ? AND updated_us = ? "
                    "AND heartbeat_us = ? AND decided_by IS NULL"
                )
                for item, state in changes:
                    values = _effect_values(item)
                    done = conn.execute(
                        update,
                        [
                            *(
                                _us(values[c]) if c.endswith("_at") else values[c]
                                for c in _UPDATED_COLUMNS
                            ),
                            values["dedup_count"],
                            item.row.id,
                            state.status,
                            state.updated_at,
                            state.heartbeat_at,
                        ],
                    )
                    if done.rowcount == 1:
                        _updated(item, state, report)
                    else:
                        _lost_race(item, report)
                statement = (
                    f"INSERT INTO agent_ledger_effects ({', '.join(columns)}, attempt) "
                    f"VALUES ({', '.join('?' for _ in columns)}, 1)"
                )
                for item in todo:
                    values = _effect_values(item)
                    conn.execute(
                        statement,
                        [
                            _us(values[c]) if c.endswith("_at") else values[c]
                            for c in _TARGET_COLUMNS
                        ],
                    )
                for item in (*todo, *mapped):
                    conn.execute(sq.RECORD_LEGACY, (item.row.idem_key, item.idem_key))
            _count(todo, report)
            _note_inexact([*todo, *mapped], report)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("ROLLBACK" if dry_run else "COMMIT")
    except sqlite3.Error as exc:
        report.imported = 0
        report.by_status.clear()
        raise EffectStoreError(
            f"nothing written: {first_line(exc)}", operation="import-0.2"
        ) from None
    finally:
        conn.close()


def _count(items: Sequence[Planned], report: ImportReport) -> None:
    report.imported += len(items)
    report.by_status.update(item.row.status for item in items)


async def import_legacy(
    source_url: str, target_url: str, *, schema: str | None = None, dry_run: bool = False
) -> ImportReport:
    """Import the 0.2.x table at ``source_url`` into the store at ``target_url``.

    The target's schema must exist and be current (``agent-ledger init`` /
    ``migrate``). With ``dry_run`` everything is read and checked, nothing
    written; the report says what would be imported.
    """
    label, rows = await read_source(source_url, schema)
    report = ImportReport(source=label, read=len(rows), dry_run=dry_run)
    items = plan(rows, report)
    scheme = target_url.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        await write_postgres(target_url, items, report, dry_run=dry_run)
    elif scheme == "sqlite" and target_url.startswith("sqlite:///"):
        write_sqlite(target_url[len("sqlite:///") :], items, report, dry_run=dry_run)
    else:
        raise EffectLedgerValidationError(
            f"import-0.2 writes into a sqlite:/// or postgresql:// store, not {target_url!r}",
            field="url",
        )
    return report
