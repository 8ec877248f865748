"""The partitioned variant of PostgresStore's effects table (postgres_partitioned.sql).

What differs from the plain table, and only that: how begin inserts (the key
table first, in the same statement), how a replay reads (the key row names
the partition), and how purge works (whole partitions detached and dropped,
rows deleted only where a partition is not wholly purgeable). Every other
statement of ``_postgres_queries`` runs unchanged on the partitioned table.
``{effects}``, ``{keys}``, ``{steps}`` are schema-qualified identifiers,
``{part}`` one partition's; everything else is a ``%(name)s`` parameter.
"""

from __future__ import annotations

from importlib import resources
from typing import Final, LiteralString

from agent_ledger.stores._columns import select_list
from agent_ledger.stores._postgres_queries import EFFECT_COLUMNS, LOCK_BOUND

#: The variant's SQL (tables, functions), applied after ``postgres_schema.sql``.
PARTITIONED_SQL: Final[LiteralString] = (
    resources.files("agent_ledger.stores").joinpath("postgres_partitioned.sql").read_text("utf-8")
)
KEYS_TABLE: Final = "agent_ledger_effect_keys"
PARTITIONING_TABLE: Final = "agent_ledger_effect_partitioning"
#: The periods a partition may span.
PERIODS: Final = ("day", "week", "month")
#: postgres_schema.sql's one statement PostgreSQL refuses on a partitioned table
#: (a unique index without the partition key, refused even when IF NOT EXISTS
#: would skip it); PostgresStore applies the file without it there.
PLAIN_ONLY_INDEX: Final[LiteralString] = (
    "CREATE UNIQUE INDEX IF NOT EXISTS agent_ledger_effects_idem_key_idx\n"
    "    ON agent_ledger_effects (idem_key);\n"
)
#: Key rows deleted per transaction after a partition is detached.
KEY_BATCH: Final = 50_000

_CTE_COLUMNS: Final = select_list(prefix="c.")


# -- begin --
# As _postgres_queries.BEGIN, with the key first: the key row is inserted
# (ON CONFLICT on its primary key: the one index probe that decides), and
# only when it was, the effect, with the key row's id and created_at. An
# existing key is read from its partition alone: the key row's (id,
# created_at) prunes the others at run time. Nothing comes back when the
# conflicting key was committed after the statement's snapshot, as for BEGIN.
def _begin(key_created_at: LiteralString) -> LiteralString:
    return (
        "WITH k AS (INSERT INTO {keys} (idem_key, id, created_at)"
        " VALUES (%(idem_key)s, gen_random_uuid(), " + key_created_at + ")"
        " ON CONFLICT (idem_key) DO NOTHING RETURNING id, created_at),"
        " c AS (INSERT INTO {effects} AS e"
        " (id, created_at, idem_key, workflow_id, call_id, tool, args_canonical,"
        " resource_id_canonical, status, lease_ms, executions, started_at, history)"
        " SELECT k.id, k.created_at, %(idem_key)s, %(workflow_id)s, %(call_id)s, %(tool)s,"
        " %(args_canonical)s, %(resource_id_canonical)s, %(status)s, %(lease_ms)s,"
        " %(executions)s, CASE WHEN %(executions)s > 0 THEN k.created_at END,"
        " %(history)s::jsonb FROM k"
        " RETURNING " + EFFECT_COLUMNS + ") "
        "SELECT " + _CTE_COLUMNS + ", true AS created FROM c "
        "UNION ALL "
        "SELECT " + EFFECT_COLUMNS + ", false AS created FROM {effects} "
        "WHERE (id, created_at) = (SELECT id, created_at FROM {keys} WHERE idem_key = %(idem_key)s)"
        " AND NOT EXISTS (SELECT 1 FROM k)"
    )


# Outside a transaction, the key row's insert bounds its wait for another
# transaction's uncommitted key row as _postgres_queries.BEGIN does (LOCK_BOUND,
# evaluated in the VALUES row, before the row meets the primary key).
BEGIN: Final[LiteralString] = _begin(
    "CASE WHEN " + LOCK_BOUND + " IS NOT NULL THEN clock_timestamp() END"
)
# Inside a caller's transaction: no per-statement setting (it would outlive it).
BEGIN_IN_TRANSACTION: Final[LiteralString] = _begin("clock_timestamp()")
# A read by key (begin's replay of a key this store has seen, find): one
# partition, named by the key row.
FIND: Final[LiteralString] = (
    "SELECT " + EFFECT_COLUMNS + " FROM {effects} "
    "WHERE (id, created_at) = (SELECT id, created_at FROM {keys} WHERE idem_key = %(idem_key)s)"
)
# A key row whose effect is gone: its partition was detached by a purge that
# has not yet deleted the partition's key rows. begin deletes it when its
# insert conflicted with it and read nothing, and tries again. A key row and
# its effect are inserted in one statement, so no snapshot sees the row
# without the effect unless the effect's partition is gone.
RECLAIM_KEY: Final[LiteralString] = (
    "DELETE FROM {keys} AS k WHERE k.idem_key = %(idem_key)s AND NOT EXISTS"
    " (SELECT 1 FROM {effects} AS e WHERE e.id = k.id AND e.created_at = k.created_at)"
)
# Partitions for now (an insert found none): the current period's and any
# before it since the newest one.
ADD_PARTITIONS_NOW: Final[LiteralString] = "SELECT {add}(clock_timestamp())"
# Partitions up to `ahead` periods on (agent_ledger_effect_partitioning).
ADD_PARTITIONS: Final[LiteralString] = "SELECT {add}()"
PARTITION_EFFECTS: Final[LiteralString] = "SELECT {partition}(%(period)s, %(ahead)s)"
# Is the effects table partitioned? NULL when it does not exist.
IS_PARTITIONED: Final[LiteralString] = (
    "SELECT c.relkind = 'p' FROM pg_class AS c WHERE c.oid = to_regclass(%(name)s)"
)
HAS_EFFECTS: Final[LiteralString] = "SELECT EXISTS (SELECT 1 FROM {effects})"

# -- purge --
# The cut-off, by the database clock, read once for the whole purge.
CUTOFF: Final[LiteralString] = "SELECT clock_timestamp() - %(older_ms)s * interval '1 millisecond'"
# Partitions wholly older than the cut-off, oldest first (bounds from the
# catalogue; see agent_ledger_effect_partitions() in postgres_partitioned.sql).
OLD_PARTITIONS: Final[LiteralString] = (
    "SELECT name, lo::text, hi::text FROM {partitions}() WHERE hi <= %(cutoff)s ORDER BY hi"
)
# Partitions a purge detached and did not finish with (it was interrupted):
# still pending detach (FINALIZE them), or detached and not yet dropped.
PENDING_DETACH: Final[LiteralString] = (
    "SELECT c.relname::text FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = to_regclass(%(name)s) AND i.inhdetachpending"
)
LEFT_DETACHED: Final[LiteralString] = (
    "SELECT c.relname::text FROM pg_class AS c"
    " WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind = 'r'"
    " AND NOT c.relispartition AND (c.relname = 'agent_ledger_effects_legacy'"
    " OR c.relname ~ '^agent_ledger_effects_p[0-9]{8}$')"
)
# What a purge keeps, as PURGE in _postgres_queries says: anything not in
# the statuses, not finished before the cut-off, or a saga's step or undo.
_KEPT: Final[LiteralString] = (
    "(NOT (e.status = ANY(%(statuses)s) AND e.completed_at <= %(cutoff)s)"
    " OR EXISTS (SELECT 1 FROM {steps} AS s"
    " WHERE s.idem_key = e.idem_key OR s.compensation_key = e.idem_key))"
)
# Does the partition hold anything the purge keeps? Then it stays, and loses
# its purgeable rows one by one (PURGE_ROWS).
HAS_KEPT: Final[LiteralString] = "SELECT EXISTS (SELECT 1 FROM {part} AS e WHERE " + _KEPT + ")"
DETACH: Final[LiteralString] = "ALTER TABLE {effects} DETACH PARTITION {part} CONCURRENTLY"
FINALIZE: Final[LiteralString] = "ALTER TABLE {effects} DETACH PARTITION {part} FINALIZE"
# The detached partition's rows: how many, and whether one became a keeper
# between HAS_KEPT and the detach (a person reopened it). Then the partition
# is attached again with its bounds (REATTACH) and purged row by row.
DETACHED_COUNT: Final[LiteralString] = (
    "SELECT count(*), count(*) FILTER (WHERE " + _KEPT + ") FROM {part} AS e"
)
# One batch of the detached partition's key rows, after `after` in key order;
# a key row counts only if it is still that effect's (a begin may have
# reclaimed the key for a new effect meanwhile). Returns the batch's last key.
DELETE_KEYS: Final[LiteralString] = (
    "WITH b AS (SELECT idem_key, id FROM {part} WHERE idem_key > %(after)s"
    " ORDER BY idem_key LIMIT %(limit)s),"
    " d AS (DELETE FROM {keys} AS k USING b WHERE k.idem_key = b.idem_key AND k.id = b.id)"
    " SELECT max(idem_key) FROM b"
)
DROP: Final[LiteralString] = "DROP TABLE {part}"
# The bounds a detached partition had, from the CHECK constraint that
# DETACH ... CONCURRENTLY leaves on it (lo NULL: from MINVALUE); no row when
# it has none (it was detached otherwise).
DETACHED_BOUNDS: Final[LiteralString] = (
    "SELECT (regexp_match(d, 'created_at >= ''([^'']+)''::timestamp'))[1],"
    " (regexp_match(d, 'created_at < ''([^'']+)''::timestamp'))[1]"
    " FROM (SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint"
    " WHERE conrelid = to_regclass(%(name)s) AND contype = 'c') AS c"
    " WHERE d ~ 'created_at < ' LIMIT 1"
)
# Before a detached partition goes back: an effect whose key row names
# another effect was superseded while it was detached (a begin took its key
# for a new effect), and cannot come back beside it.
SUPERSEDED: Final[LiteralString] = (
    "DELETE FROM {part} AS e WHERE NOT EXISTS (SELECT 1 FROM {keys} AS k"
    " WHERE k.idem_key = e.idem_key AND k.id = e.id)"
)
# {lo} is a literal or MINVALUE, {hi} a literal: the bounds the partition had.
REATTACH: Final[LiteralString] = (
    "ALTER TABLE {effects} ATTACH PARTITION {part} FOR VALUES FROM ({lo}) TO ({hi})"
)
# Row by row, where whole partitions could not go: only partitions reaching
# back past the cut-off are read (created_at <= completed_at <= cut-off),
# and each effect's key row goes with it.
PURGE_ROWS: Final[LiteralString] = (
    "WITH d AS (DELETE FROM {effects} AS e WHERE e.created_at <= %(cutoff)s"
    " AND NOT " + _KEPT + " RETURNING e.idem_key, e.id),"
    " k AS (DELETE FROM {keys} AS k USING d WHERE k.idem_key = d.idem_key AND k.id = d.id)"
    " SELECT count(*) FROM d"
)
