"""Every SQL statement PostgresStore runs, one per ledger step, in one place.

``{effects}`` is the schema-qualified effects table, filled in once with
``psycopg.sql.Identifier``; everything else is a ``%(name)s`` parameter,
statuses included (they come from ``EffectStatus``, never retyped here).
Each statement is one round trip and runs in autocommit unless the caller
passed a transaction.
"""

from __future__ import annotations

from typing import Final, LiteralString

from agent_ledger.stores._columns import select_list

# How PostgreSQL keeps the fields it does not keep as-is (see _columns): the
# id is a uuid and the result json, both read back as text; the error is one
# jsonb object, read back as its two parts.
_EXPRESSIONS: Final = {
    "id": "id::text AS id",
    "result": "result::text AS result",
    "error_message": "error->>'message' AS error_message",
    "error_code": "error->>'code' AS error_code",
    # Parsed by the library (orjson), not by psycopg's json loader.
    "history": "history::text AS history",
    "usage": "usage::text AS usage",
}
#: The columns every query returns, in the order ``effect_from_row`` reads them.
#: Built only from the constant names in _columns and above, never from caller text.
EFFECT_COLUMNS: Final = select_list(_EXPRESSIONS)
# The same columns read back from claim's CTE `c`, where they already have their row names.
_CTE_COLUMNS: Final = select_list(prefix="c.")


# -- begin --
# Insert-or-read in one statement, which writes nothing for an existing key.
# A new key is inserted (c) as processing (or, for a call that needs
# approval, straight into requires_approval: never claimable before a person
# decides), attempt 1, with its creator's lease; as processing it is the
# first execution, and comes back with created = true. An existing key:
# ON CONFLICT DO NOTHING finds the conflict in the unique index before
# writing anything, and the row is read from the statement's snapshot with
# created = false: no row lock, no transaction id, no WAL, no wait for a
# flush at commit. A finished effect (a replay) is counted later, in a batch
# (DEDUP_FLUSH); an open one is counted by COUNT_WAITING, a second statement
# only callers that may wait send. (One statement with that update as a
# third branch cost a fresh run 60-90 µs more, measured interleaved: the
# update's CTE runs, and is planned, on every begin.) When the conflicting
# row was committed after the statement's snapshot was taken (the insert
# waited for a concurrent first insert of the key), the snapshot cannot see
# it and nothing comes back: that is not "absent", and PostgresStore runs
# the statement again, whose fresh snapshot sees it (FIND, in a caller's
# transaction).
#
# Outside a transaction the insert may still wait: for another transaction
# that inserted the key and has not ended. That wait is bounded by the
# caller's lock_timeout_ms (LOCK_BOUND, below), set in the VALUES row, so it
# is in force before the row meets the unique index.
def _insert(lease_ms: LiteralString) -> LiteralString:
    return (
        "INSERT INTO {effects} AS e "
        "(idem_key, workflow_id, call_id, tool, args_canonical, resource_id_canonical, status,"
        " lease_ms, executions, started_at, history) "
        "VALUES (%(idem_key)s, %(workflow_id)s, %(call_id)s, %(tool)s, %(args_canonical)s, "
        "%(resource_id_canonical)s, %(status)s, " + lease_ms + ", %(executions)s,"
        " CASE WHEN %(executions)s > 0 THEN clock_timestamp() END, %(history)s::jsonb)"
        " ON CONFLICT (idem_key) DO NOTHING RETURNING " + EFFECT_COLUMNS
    )


def _insert_or_read(insert: LiteralString) -> LiteralString:
    return (
        "WITH c AS (" + insert + ") "
        "SELECT " + _CTE_COLUMNS + ", true AS created FROM c "
        "UNION ALL "
        "SELECT " + EFFECT_COLUMNS + ", false AS created FROM {effects} "
        "WHERE idem_key = %(idem_key)s AND NOT EXISTS (SELECT 1 FROM c)"
    )


# -- lock waits of a step outside any transaction --
# begin's insert, count_waiting's and claim's update can wait for a lock
# another transaction holds on the key (its uncommitted insert or claim of
# it). Each bounds that wait itself, with no round trip more: it sets
# lock_timeout to %(lock_timeout)s (e.g. '100ms'; NULL keeps the setting)
# for its own implicit transaction (set_config(..., true): gone when the
# statement ends, committed or failed, so the pooled connection goes back
# as it came), before it writes or locks a row: in the VALUES row, or in the
# WHERE (evaluated on the row before the update waits for its lock). A
# wait that runs out fails the statement with SQLSTATE 55P03, having changed
# nothing. Only a step without tx= runs these: inside a caller's transaction
# the setting would outlive the statement (see LOCK_BOUND_* for that case).
LOCK_BOUND: Final[LiteralString] = (
    "set_config('lock_timeout', coalesce(%(lock_timeout)s, current_setting('lock_timeout')), true)"
)
BEGIN: Final[LiteralString] = _insert_or_read(
    _insert("CASE WHEN " + LOCK_BOUND + " IS NOT NULL THEN %(lease_ms)s END")
)
# A duplicate of an open effect (processing, waiting for a person, ready) is
# counted at once, synchronously, as it always was: a caller that may wait
# for it must have counted before the holder commits, because the notify
# trigger stays quiet for a commit with dedup_count = 0. Nothing comes back
# if the effect finished (or was purged) since BEGIN read it: begin then
# reads it again.
COUNT_WAITING: Final[LiteralString] = (
    "UPDATE {effects} AS e SET dedup_count = e.dedup_count + 1"
    " WHERE e.id = %(id)s::uuid AND e.status <> ALL(%(finished)s) AND " + LOCK_BOUND + " <> ''"
    " RETURNING " + EFFECT_COLUMNS
)

# -- begin, inside a caller's transaction --
# BEGIN alone: an existing key is only read, whatever its status. A write
# would lock its row until the caller's transaction ends, and the holder's
# heartbeats and commit would queue behind it. So nothing counts the
# duplicate here (Store.begin says so). When the conflicting row was
# committed after the statement's snapshot nothing comes back, and FIND
# reads it.
BEGIN_IN_TRANSACTION: Final[LiteralString] = _insert_or_read(_insert("%(lease_ms)s"))

# -- duplicate counts --
# One statement for every key this store counted duplicates of since the
# last flush: `keys` and `counts` are parallel arrays. Committed
# asynchronously (set_config(..., true) is SET LOCAL for the statement's own
# transaction, read when it commits, after the statement): a lost count is the documented bound,
# and the flush must not wait for the disk. A row another transaction has
# locked is skipped (SKIP LOCKED), never waited for, so a flush neither
# queues behind a caller's open transaction nor deadlocks with another
# process's flush. `ids` are effect ids, not keys: a key purged and used
# again by a new effect must not get the old effect's counts. The statement
# returns the ids it skipped that still exist, whose increments the store
# keeps for the next flush; an effect that is gone (purged) has nobody left
# to count for.
DEDUP_FLUSH: Final[LiteralString] = (
    "WITH batch AS ("
    " SELECT b.k, b.n FROM unnest(%(ids)s::uuid[], %(counts)s::int[]) AS b(k, n)"
    "), free AS ("
    " SELECT e.id, batch.n FROM {effects} AS e JOIN batch ON e.id = batch.k"
    " ORDER BY e.id FOR NO KEY UPDATE OF e SKIP LOCKED"
    "), bumped AS ("
    " UPDATE {effects} AS e SET dedup_count = e.dedup_count + free.n FROM free"
    " WHERE e.id = free.id RETURNING e.id"
    ") "
    # A SELECT without FROM gives one row whatever the batch matched, so the
    # setting is always made (in a CTE or a join it could go unevaluated).
    "SELECT set_config('synchronous_commit', 'off', true),"
    " ARRAY(SELECT e.id::text FROM {effects} AS e JOIN batch ON e.id = batch.k"
    " WHERE e.id NOT IN (SELECT id FROM bumped))"
)
# This process's duplicates of these effects are added to what is read here
# (see stores/_dedup.py): the count alone, read again after a flush.
DEDUP_COUNTS: Final[LiteralString] = (
    "SELECT id::text, dedup_count FROM {effects} WHERE id = ANY(%(ids)s::uuid[])"
)

# -- bounded lock waits, inside a caller's transaction --
# begin and claim with a caller's transaction run between these two: a
# savepoint, so that a lock timeout (or any failure) is undone without
# aborting the caller's transaction, and lock_timeout set for the
# transaction, so no lock wait outlasts {lock_timeout}. The first returns
# the setting it replaced (read before it is changed: MATERIALIZED runs the
# CTE first), and the second puts that back before releasing the savepoint,
# so the caller's own lock_timeout is untouched. After a failure, rolling
# back to the savepoint undoes the setting too. Each pair of statements goes
# in one round trip (no parameters: the values are psycopg.sql.Literal).
LOCK_BOUND_SAVEPOINT: Final[LiteralString] = "agent_ledger_bounded_step"
LOCK_BOUND_BEGIN: Final[LiteralString] = (
    "SAVEPOINT " + LOCK_BOUND_SAVEPOINT + "; "
    "WITH prior AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value) "
    "SELECT value, set_config('lock_timeout', {lock_timeout}, true) FROM prior"
)
LOCK_BOUND_END: Final[LiteralString] = (
    "SELECT set_config('lock_timeout', {prior}, true); RELEASE SAVEPOINT " + LOCK_BOUND_SAVEPOINT
)
LOCK_BOUND_UNDO: Final[LiteralString] = (
    "ROLLBACK TO SAVEPOINT " + LOCK_BOUND_SAVEPOINT + "; RELEASE SAVEPOINT " + LOCK_BOUND_SAVEPOINT
)


# -- claim --
# Take the effect from any status in `claimable` (status.CLAIMABLE: ready, and
# processing itself), but from processing only when its heartbeat is older
# than the holder's lease, and than the caller's stale_ms, by the database
# clock: a takeover (0 on either side: never), and never of an attempt whose
# handler started under on_stale="park" (PARK takes those). +1 attempt fences the previous
# holder; the caller's lease_ms becomes the new holder's lease. Concurrent
# claims serialize on the row lock and re-check the WHERE, so one wins. If
# nothing was claimed, the same statement returns the row as it stands, so a
# waiter's poll is one round trip either way.
def _claim(bound: LiteralString) -> LiteralString:
    return (
        "WITH c AS ("
        " UPDATE {effects} SET status = %(processing)s, attempt = attempt + 1,"
        " executions = executions + 1, lease_ms = %(lease_ms)s,"
        " heartbeat_at = clock_timestamp(), started_at = clock_timestamp(),"
        " updated_at = clock_timestamp()"
        " WHERE idem_key = %(idem_key)s AND status = ANY(%(claimable)s)"
        " AND (status <> %(processing)s OR (%(stale_ms)s > 0 AND lease_ms > 0"
        " AND heartbeat_at <= clock_timestamp()"
        " - greatest(lease_ms, %(stale_ms)s) * interval '1 millisecond'"
        " AND park_attempt IS DISTINCT FROM attempt))" + bound + ""
        " RETURNING " + EFFECT_COLUMNS + ") "
        "SELECT " + _CTE_COLUMNS + ", true AS claimed FROM c "
        "UNION ALL "
        "SELECT " + EFFECT_COLUMNS + ", false AS claimed FROM {effects} "
        "WHERE idem_key = %(idem_key)s AND NOT EXISTS (SELECT 1 FROM c)"
    )


# Outside a transaction its wait for the row's lock is bounded (LOCK_BOUND).
CLAIM: Final[LiteralString] = _claim(" AND " + LOCK_BOUND + " <> ''")
CLAIM_IN_TRANSACTION: Final[LiteralString] = _claim("")

# -- heartbeat --
# One statement for every effect a ledger runs: `ids` and `attempts` are
# parallel arrays, one (id, attempt) pair per effect. Liveness is refreshed
# only for the holder (still processing, same attempt). A row another
# transaction has locked is skipped (SKIP LOCKED), not waited for, so one
# locked row cannot hold up the whole batch; rows are locked in the same
# mode the UPDATE would take. The final SELECT reads the statement's
# snapshot: every pair still held as last committed, with `refreshed` false
# for the skipped ones (busy: send again next time). A pair missing from
# the answer is no longer held.
HEARTBEAT: Final[LiteralString] = (
    "WITH held AS ("
    " SELECT h.id, h.attempt FROM unnest(%(ids)s::uuid[], %(attempts)s::int[]) AS h(id, attempt)"
    "), free AS ("
    " SELECT e.id FROM {effects} AS e JOIN held ON e.id = held.id AND e.attempt = held.attempt"
    " WHERE e.status = %(processing)s FOR NO KEY UPDATE OF e SKIP LOCKED"
    "), beat AS ("
    " UPDATE {effects} AS e SET heartbeat_at = clock_timestamp() FROM free"
    " WHERE e.id = free.id RETURNING e.id"
    ") "
    "SELECT e.id::text, e.attempt, e.id IN (SELECT id FROM beat) AS refreshed "
    "FROM {effects} AS e JOIN held ON e.id = held.id AND e.attempt = held.attempt "
    "WHERE e.status = %(processing)s"
)

# -- commit --
# Compare-and-set processing -> succeeded/failed/canceled on (id, status,
# attempt): the first commit wins, and a late commit from an older attempt
# matches no row. A NULL attempt skips the fencing check (unfenced commit()).
COMMIT: Final[LiteralString] = (
    "UPDATE {effects} SET status = %(status)s, result = %(result)s::json,"
    " usage = %(usage)s::json,"
    " error = %(error)s::jsonb, tries = tries + %(tried)s::integer,"
    " executions = executions - %(unstarted)s::integer,"
    " completed_at = clock_timestamp(), updated_at = clock_timestamp(),"
    " history = CASE WHEN %(retryable)s THEN history || jsonb_build_array(%(error)s::jsonb"
    " || jsonb_build_object('kind', %(retryable_kind)s::text, 'attempt', attempt,"
    " 'at', clock_timestamp())) ELSE history END "
    "WHERE id = %(id)s AND status = %(processing)s"
    " AND (%(attempt)s::integer IS NULL OR attempt = %(attempt)s::integer)"
)

# -- record_try --
# One failed try of a retried handler, fenced like a commit on (id, status,
# attempt) but leaving the status as it is (so the notify trigger stays
# quiet): +1 try, and the try's failure (`event`, JSON from _params) appended
# to the history with its number (the new count: SET reads the row's old
# values) and the database's time. The holder is alive: its heartbeat too.
RECORD_TRY: Final[LiteralString] = (
    "UPDATE {effects} SET tries = tries + 1,"
    " history = history || jsonb_build_array(%(event)s::jsonb"
    " || jsonb_build_object('try', tries + 1, 'at', clock_timestamp())),"
    " heartbeat_at = clock_timestamp() "
    "WHERE id = %(id)s AND status = %(processing)s AND attempt = %(attempt)s"
)

# -- release --
# Compare-and-set processing -> ready on (id, status, attempt): the holder gives
# the effect back before its handler started, so the claim's execution is taken
# back (started_at cleared when none is left; SET reads the row's old values).
# Heartbeat and lease stay. The notify trigger fires (processing -> ready is a
# status change that is no handler outcome), so waiters claim it at once.
RELEASE: Final[LiteralString] = (
    "UPDATE {effects} SET status = %(ready)s, executions = executions - 1,"
    " started_at = CASE WHEN executions = 1 THEN NULL ELSE started_at END,"
    " updated_at = clock_timestamp() "
    "WHERE id = %(id)s AND status = %(processing)s AND attempt = %(attempt)s"
)

# -- transition --
# Compare-and-set by key from any allowed source status (request_approval,
# approve, deny, cancel). The error (a decision's reason) is kept when given,
# and so is who decided; completed_at is set when the target is terminal.
TRANSITION: Final[LiteralString] = (
    "UPDATE {effects} SET status = %(target)s, updated_at = clock_timestamp(),"
    " error = coalesce(%(error)s::jsonb, error),"
    " decided_by = CASE WHEN %(decided)s THEN %(decided_by)s ELSE decided_by END,"
    " decision_note = CASE WHEN %(decided)s THEN %(decision_note)s ELSE decision_note END,"
    " decided_at = CASE WHEN %(decided)s THEN clock_timestamp() ELSE decided_at END,"
    " completed_at = CASE WHEN %(terminal)s THEN clock_timestamp() ELSE completed_at END "
    "WHERE idem_key = %(idem_key)s AND status = ANY(%(sources)s) "
    "RETURNING " + EFFECT_COLUMNS
)

# -- reopen --
# Compare-and-set by key from failed or canceled (`sources`) to ready. How
# the effect had ended (status, error, tries) goes to the history with who
# reopened it, why and when (SET reads the row's old values); the error and
# completion are cleared, the tries start again, and the reopening is the
# latest decision. One reading of the clock (`n.now`), so the history's time
# and decided_at are equal. The attempt stays: the next claim moves it on.
REOPEN: Final[LiteralString] = (
    "UPDATE {effects} AS e SET status = %(ready)s,"
    " history = e.history || jsonb_build_array(jsonb_build_object('kind', %(kind)s::text,"
    " 'status', e.status, 'error', e.error, 'tries', e.tries, 'by', %(by)s::text,"
    " 'reason', %(reason)s::text, 'at', n.now)),"
    " error = NULL, tries = 0, completed_at = NULL,"
    " decided_by = %(by)s, decision_note = %(reason)s, decided_at = n.now, updated_at = n.now "
    "FROM (SELECT clock_timestamp() AS now) AS n "
    "WHERE e.idem_key = %(idem_key)s AND e.status = ANY(%(sources)s) "
    "RETURNING " + EFFECT_COLUMNS
)

# -- retry_failed --
# Compare-and-set failed -> processing at exactly `attempt` (the failure the
# caller read), for a later call after a retryable failure: concurrent callers
# serialize on the row lock and re-check the WHERE, so exactly one wins. Like
# a claim: attempt + 1, one more execution, the caller's lease, heartbeat and
# start now; like a reopen: the outcome cleared and the tries counted afresh.
# The history keeps the failure. If nothing changed, the same statement
# returns the row as it stands (`claimed` false), as CLAIM does.
RETRY_FAILED: Final[LiteralString] = (
    "WITH c AS ("
    " UPDATE {effects} SET status = %(processing)s, attempt = attempt + 1,"
    " executions = executions + 1, lease_ms = %(lease_ms)s, result = NULL, usage = NULL,"
    " error = NULL, tries = 0, completed_at = NULL, heartbeat_at = clock_timestamp(),"
    " started_at = clock_timestamp(), updated_at = clock_timestamp()"
    " WHERE idem_key = %(idem_key)s AND status = %(failed)s AND attempt = %(attempt)s"
    " RETURNING " + EFFECT_COLUMNS + ") "
    "SELECT " + _CTE_COLUMNS + ", true AS claimed FROM c "
    "UNION ALL "
    "SELECT " + EFFECT_COLUMNS + ", false AS claimed FROM {effects} "
    "WHERE idem_key = %(idem_key)s AND NOT EXISTS (SELECT 1 FROM c)"
)

# -- ambiguous attempts (schema version 3) --
# mark_started: a run under on_stale="park" records, fenced by its attempt,
# that its handler starts now, and who runs it. A sign of life too.
MARK_STARTED: Final[LiteralString] = (
    "UPDATE {effects} SET park_attempt = attempt, worker = %(worker)s,"
    " heartbeat_at = clock_timestamp() "
    "WHERE id = %(id)s AND status = %(processing)s AND attempt = %(attempt)s"
)
# park: processing -> requires_approval, only for the attempt whose handler
# was recorded as started under park, and only once its holder has been
# silent for the longer of its lease and stale_ms (0 on either side: never),
# as a takeover would judge it. Concurrent parks and claims serialize on the
# row lock and re-check the WHERE, so one wins. The reason goes to the
# error; the history keeps which attempt, when it started, who ran it, its
# last heartbeat and when it was parked (SET reads the row's old values).
# The attempt stays: it is the one a person settles. If nothing was parked,
# the same statement returns the row as it stands (a waiter's poll).
PARK: Final[LiteralString] = (
    "WITH c AS ("
    " UPDATE {effects} AS e SET status = %(requires_approval)s, error = %(error)s::jsonb,"
    " updated_at = n.now,"
    " history = e.history || jsonb_build_array(jsonb_build_object('kind', %(kind)s::text,"
    " 'attempt', e.attempt, 'started_at', e.started_at, 'worker', e.worker,"
    " 'heartbeat_at', e.heartbeat_at, 'at', n.now))"
    " FROM (SELECT clock_timestamp() AS now) AS n"
    " WHERE e.idem_key = %(idem_key)s AND e.status = %(processing)s"
    " AND e.park_attempt = e.attempt AND %(stale_ms)s > 0 AND e.lease_ms > 0"
    " AND e.heartbeat_at <= n.now - greatest(e.lease_ms, %(stale_ms)s) * interval '1 millisecond'"
    " RETURNING " + EFFECT_COLUMNS + ") "
    "SELECT " + _CTE_COLUMNS + ", true AS parked FROM c "
    "UNION ALL "
    "SELECT " + EFFECT_COLUMNS + ", false AS parked FROM {effects} "
    "WHERE idem_key = %(idem_key)s AND NOT EXISTS (SELECT 1 FROM c)"
)
# settle: a person's approve, deny or resolve, requires_approval -> target,
# at the attempt they saw (expected_attempt; NULL: any) and, for resolve,
# only a parked effect. The error and result become what the decision says
# (approve clears a park's reason); the history keeps who, the attempt, the
# note and when (one reading of the clock, equal to decided_at), and the
# decision is the latest one.
SETTLE: Final[LiteralString] = (
    "UPDATE {effects} AS e SET status = %(target)s, result = %(result)s::json,"
    " error = %(error)s::jsonb,"
    " history = e.history || jsonb_build_array(jsonb_build_object('kind', %(kind)s::text,"
    " 'status', %(target)s::text, 'attempt', e.attempt, 'by', %(decided_by)s::text,"
    " 'note', %(decision_note)s::text, 'at', n.now)),"
    " decided_by = %(decided_by)s, decision_note = %(decision_note)s, decided_at = n.now,"
    " completed_at = CASE WHEN %(terminal)s THEN n.now ELSE e.completed_at END,"
    " tries = CASE WHEN %(fresh_tries)s AND e.error->>'code' = %(ambiguous)s"
    " THEN 0 ELSE e.tries END,"
    " updated_at = n.now "
    "FROM (SELECT clock_timestamp() AS now) AS n "
    "WHERE e.idem_key = %(idem_key)s AND e.status = %(requires_approval)s"
    " AND (%(expected_attempt)s::integer IS NULL OR e.attempt = %(expected_attempt)s::integer)"
    " AND (NOT %(only_parked)s OR e.error->>'code' = %(ambiguous)s)"
    # Past the request's deadline, by this database's clock, only a denial.
    " AND (%(ignores_deadline)s OR NOT EXISTS (SELECT 1 FROM {approvals} AS a"
    " WHERE a.idem_key = e.idem_key AND a.deadline_at <= n.now)) "
    "RETURNING " + EFFECT_COLUMNS
)

# -- get / find --
GET: Final[LiteralString] = "SELECT " + EFFECT_COLUMNS + " FROM {effects} WHERE id = %(id)s"
FIND: Final[LiteralString] = (
    "SELECT " + EFFECT_COLUMNS + " FROM {effects} WHERE idem_key = %(idem_key)s"
)

# -- find_legacy / record_legacy --
# The effect a 0.2.x key was imported as: two primary-key reads in one
# statement. A mapping whose effect was purged finds nothing.
FIND_LEGACY: Final[LiteralString] = (
    "SELECT " + EFFECT_COLUMNS + " FROM {effects} WHERE idem_key = "
    "(SELECT idem_key FROM {legacy_keys} WHERE legacy_key = %(legacy_key)s)"
)
# The first mapping of a 0.2.x key stays (a second import changes nothing).
RECORD_LEGACY: Final[LiteralString] = (
    "INSERT INTO {legacy_keys} (legacy_key, idem_key) VALUES (%(legacy_key)s, %(idem_key)s) "
    "ON CONFLICT (legacy_key) DO NOTHING"
)

# -- list_effects --
# The audit trail, newest first. Only the filters the caller gave are joined
# into the WHERE clause (fragments below, never caller text), so each
# combination can use its index; `before` is the keyset position.
LIST: Final[LiteralString] = "SELECT " + EFFECT_COLUMNS + " FROM {effects}"
# Handler time (effects.handler_time, which says why): from the run's start to
# its recorded end, or to now while it runs; NULL (never matching) when no
# run's end is known.
HANDLER_TIME: Final[LiteralString] = (
    "(CASE WHEN started_at IS NULL OR decided_at > started_at THEN NULL"
    " WHEN status = %(processing)s THEN clock_timestamp() - started_at"
    " WHEN status = ANY(%(run_ends)s) THEN completed_at - started_at END)"
)
LIST_FILTERS: Final[dict[str, LiteralString]] = {
    "workflow_id": "workflow_id = %(workflow_id)s",
    "tool": "tool = %(tool)s",
    "status": "status = %(status)s",
    "since": "created_at >= %(since)s",
    "until": "created_at < %(until)s",
    "before": "(created_at, id) < (%(before_at)s, %(before_id)s::uuid)",
    # A range rather than LIKE, so the unique index on idem_key serves it
    # under any collation: keys are lowercase hex and 'g' sorts after 'f'.
    "idem_key_prefix": "idem_key >= %(idem_key_prefix)s AND idem_key < %(idem_key_prefix)s || 'g'",
    "call_id": "call_id = %(call_id)s",
    "error_code": "error->>'code' = %(error_code)s",
    "min_duration": HANDLER_TIME + " >= %(min_duration_us)s * interval '1 microsecond'",
    "max_duration": HANDLER_TIME + " <= %(max_duration_us)s * interval '1 microsecond'",
}
LIST_ORDER: Final[LiteralString] = " ORDER BY created_at DESC, id DESC LIMIT %(limit)s"

# -- stats --
# One pass over the table: counts and duplicates per (status, tool).
STATS: Final[LiteralString] = (
    "SELECT status, tool, count(*), coalesce(sum(dedup_count), 0) FROM {effects} "
    "GROUP BY status, tool"
)

# -- purge --
# Retention: terminal effects (the caller passes only terminal statuses)
# completed at least older_ms ago by the database clock.
PURGE: Final[LiteralString] = (
    "DELETE FROM {effects} e WHERE status = ANY(%(statuses)s)"
    " AND completed_at <= clock_timestamp() - %(older_ms)s * interval '1 millisecond'"
    # A saga's step or undo stays: without it `sagas show` would list the
    # saga's steps as never run (sagas themselves are never purged).
    " AND NOT EXISTS (SELECT 1 FROM {steps} s"
    " WHERE s.idem_key = e.idem_key OR s.compensation_key = e.idem_key)"
)

# -- schema --
SCHEMA_VERSION: Final[LiteralString] = "SELECT max(version) FROM {versions}"
# The same, with whether the effects table (`name`: qualified, quoted) is
# partitioned, so the first step's schema check learns both in one statement.
SCHEMA_VERSION_AND_KIND: Final[LiteralString] = (
    "SELECT max(version),"
    " (SELECT c.relkind = 'p' FROM pg_class AS c WHERE c.oid = to_regclass(%(name)s))"
    " FROM {versions}"
)
# Is there a version marker yet? `name` is the qualified, quoted table name.
HAS_VERSIONS_TABLE: Final[LiteralString] = "SELECT to_regclass(%(name)s) IS NOT NULL"

# -- sagas (schema version 3; see stores/saga_base.py) --
# {sagas} and {steps} are the schema-qualified tables. Times come from
# clock_timestamp(), the database's clock, as for effects.
_SAGA_COLUMNS: Final[LiteralString] = (
    "saga_id, status, attempt, owner, lease_ms, heartbeat_at, abandon_after_ms,"
    " on_compensation_failure, error->>'message', error->>'code', created_at, updated_at,"
    " completed_at"
)
_STEP_COLUMNS: Final[LiteralString] = (
    "saga_id, position, group_index, tool, idem_key, compensation, compensation_key,"
    " compensate_if, created_at"
)
# Insert-or-get in one statement; `xmax = 0` tells a fresh insert (as BEGIN does).
SAGA_BEGIN: Final[LiteralString] = (
    "INSERT INTO {sagas} AS s (saga_id, status, owner, lease_ms, abandon_after_ms,"
    " on_compensation_failure)"
    " VALUES (%(saga_id)s, %(status)s, %(owner)s, %(lease_ms)s, %(abandon_after_ms)s,"
    " %(on_compensation_failure)s)"
    " ON CONFLICT (saga_id) DO UPDATE SET saga_id = s.saga_id"
    " RETURNING " + _SAGA_COLUMNS + ", (xmax = 0) AS created"
)
SAGA_GET: Final[LiteralString] = "SELECT " + _SAGA_COLUMNS + " FROM {sagas} WHERE saga_id = %s"
# A takeover, as CLAIM is for effects: concurrent claims serialize on the
# row and re-check the WHERE, so exactly one wins (+1 attempt).
SAGA_CLAIM: Final[LiteralString] = (
    "UPDATE {sagas} SET status = %(then)s, attempt = attempt + 1, owner = %(owner)s,"
    " lease_ms = %(lease_ms)s, heartbeat_at = clock_timestamp(), updated_at = clock_timestamp()"
    " WHERE saga_id = %(saga_id)s AND status = %(expect)s AND lease_ms > 0"
    " AND heartbeat_at <= clock_timestamp()"
    " - make_interval(secs => greatest(lease_ms, %(idle_ms)s) / 1000.0)"
    " RETURNING " + _SAGA_COLUMNS
)
SAGA_HEARTBEAT: Final[LiteralString] = (
    "UPDATE {sagas} SET heartbeat_at = clock_timestamp()"
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status = ANY(%(open)s)"
)
SAGA_RELEASE: Final[LiteralString] = (
    "UPDATE {sagas} SET heartbeat_at = 'epoch'"
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status = %(compensating)s"
)
SAGA_FINISH: Final[LiteralString] = (
    "UPDATE {sagas} SET status = %(then)s, heartbeat_at = clock_timestamp(),"
    " updated_at = clock_timestamp(), error = coalesce(%(error)s::jsonb, error),"
    " completed_at = CASE WHEN %(terminal)s THEN clock_timestamp() END"
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status = %(expect)s"
)
# Insert the step only for the owner of the running saga. FOR SHARE holds the
# saga row until this statement's transaction ends, so a claim (an UPDATE of
# that row) waits for it: a takeover that then reads the steps sees this one,
# and an insert after the takeover finds the attempt changed and adds nothing.
# The existing step comes back when the position was already recorded.
STEP_RECORD: Final[LiteralString] = (
    "WITH owner AS (SELECT saga_id FROM {sagas}"
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status = %(running)s"
    " FOR SHARE),"
    " inserted AS (INSERT INTO {steps} (saga_id, position, group_index, tool, idem_key,"
    " compensation, compensation_key, compensate_if)"
    " SELECT saga_id, %(position)s, %(group_index)s, %(tool)s, %(idem_key)s, %(compensation)s,"
    " %(compensation_key)s, %(compensate_if)s FROM owner"
    " ON CONFLICT (saga_id, position) DO NOTHING RETURNING " + _STEP_COLUMNS + ")"
    " SELECT " + _STEP_COLUMNS + " FROM inserted"
    " UNION ALL SELECT " + _STEP_COLUMNS + " FROM {steps}"
    " WHERE saga_id = %(saga_id)s AND position = %(position)s"
    " AND EXISTS (SELECT 1 FROM owner)"
)
SAGA_STEPS: Final[LiteralString] = (
    "SELECT " + _STEP_COLUMNS + " FROM {steps} WHERE saga_id = %s ORDER BY position"
)
SAGA_LIST: Final[LiteralString] = (
    "SELECT " + _SAGA_COLUMNS + " FROM {sagas}"
    " WHERE %(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s)"
    " ORDER BY created_at DESC, saga_id DESC LIMIT %(limit)s"
)
# What a recoverer's SAGA_CLAIM would take now, oldest first, after a cursor.
# The statuses are written out, not passed: a prepared statement's generic plan
# can then use the partial index of open sagas instead of reading every saga
# ever finished.
SAGA_CLAIMABLE: Final[LiteralString] = (
    "SELECT " + _SAGA_COLUMNS + " FROM {sagas} WHERE lease_ms > 0"
    " AND status IN ('compensating', 'running')"
    " AND ((status = 'compensating'"
    " AND heartbeat_at <= clock_timestamp() - make_interval(secs => lease_ms / 1000.0))"
    " OR (status = 'running' AND abandon_after_ms IS NOT NULL"
    " AND heartbeat_at <= clock_timestamp()"
    " - make_interval(secs => greatest(lease_ms, abandon_after_ms) / 1000.0)))"
    " AND (%(after_at)s::timestamptz IS NULL"
    " OR (created_at, saga_id) > (%(after_at)s::timestamptz, %(after_id)s::text))"
    " ORDER BY created_at, saga_id LIMIT %(limit)s"
)

# -- budgets (schema version 3; see stores/budget_base.py) --
# {budgets}, {holds} and {charges} are the schema-qualified tables. Amounts
# are bigints in each unit (dollars in millionths). Every step that deletes
# holds locks them in hold_id order before it touches the budget row, and
# reserve locks only the budget row, so two steps never wait on each other
# in a circle.
_BUDGET_COLUMNS: Final[LiteralString] = (
    "b.workflow_id, b.limit_usd_micros, b.limit_input_tokens, b.limit_output_tokens,"
    " b.limit_tool_calls, b.spent_usd_micros, b.spent_input_tokens, b.spent_output_tokens,"
    " b.spent_tool_calls, b.reserved_usd_micros, b.reserved_input_tokens,"
    " b.reserved_output_tokens, b.reserved_tool_calls,"
    " (SELECT count(DISTINCT h.idem_key) FROM {holds} AS h WHERE h.workflow_id = b.workflow_id),"
    " b.created_at, b.updated_at"
)
# Insert-or-get; DO UPDATE (a no-op write) so that the row comes back even when
# a concurrent open inserted it after this statement's snapshot.
BUDGET_OPEN: Final[LiteralString] = (
    "INSERT INTO {budgets} AS b (workflow_id, limit_usd_micros, limit_input_tokens,"
    " limit_output_tokens, limit_tool_calls)"
    " VALUES (%(workflow_id)s, %(limit_usd_micros)s, %(limit_input_tokens)s,"
    " %(limit_output_tokens)s, %(limit_tool_calls)s)"
    " ON CONFLICT (workflow_id) DO UPDATE SET workflow_id = b.workflow_id"
    " RETURNING " + _BUDGET_COLUMNS
)
BUDGET_GET: Final[LiteralString] = (
    "SELECT " + _BUDGET_COLUMNS + " FROM {budgets} AS b WHERE b.workflow_id = %s"
)
BUDGET_LIST: Final[LiteralString] = (
    "SELECT " + _BUDGET_COLUMNS + " FROM {budgets} AS b"
    " ORDER BY b.updated_at DESC, b.workflow_id DESC LIMIT %(limit)s"
)
_UNITS: Final = ("usd_micros", "input_tokens", "output_tokens", "tool_calls")


def _each(template: LiteralString, joiner: LiteralString) -> LiteralString:
    """``template`` for every unit (``{u}`` its column), joined by ``joiner``."""
    return joiner.join(template.replace("{u}", unit) for unit in _UNITS)


# Every budget step that changes holds or the budget row is one transaction
# that first locks the budget row (BUDGET_LOCK), then runs its statement in
# a fresh snapshot (READ COMMITTED: a snapshot per statement). A single
# statement cannot do both: its snapshot is taken before it waits for the
# lock, so it could not see the holds a concurrent step inserted or deleted
# meanwhile, and an effect's room (the largest estimate among its holds)
# would be worked out from stale holds (two callers of one effect each
# adding a hold's room, a second caller refused). With the lock first, the
# steps of one budget run one after another and each sees all the holds;
# the lock order is the budget row, then charge rows, then holds, in every
# step, so none waits on another in a circle.
BUDGET_LOCK: Final[LiteralString] = (
    "SELECT 1 FROM {budgets} WHERE workflow_id = %(workflow_id)s FOR UPDATE"
)
# The reservation, after BUDGET_LOCK. The effect's holds (`g`: its callers
# share one room, the largest estimate among its live holds, unit by unit;
# expired ones, a dead worker's, are dropped): `o` the room it takes now,
# `n` with this hold. The budget row grows by n - o if that fits (the rule of
# stores/budget_base.py with the effect's room not counted against itself),
# or always when it joins live holds and does not grow the room in any unit
# the call counts in (the call was admitted when they were made). Per unit:
# no limit, or the call does not count in it (a NULL estimate), or
# spent + reserved - o + n <= limit with room left.
BUDGET_RESERVE: Final[LiteralString] = (
    "WITH g AS MATERIALIZED (SELECT hold_id, usd_micros, input_tokens, output_tokens,"
    " tool_calls, expires_at <= clock_timestamp() AS dead FROM {holds}"
    " WHERE workflow_id = %(workflow_id)s AND idem_key = %(idem_key)s),"
    " r AS (SELECT count(*) FILTER (WHERE NOT dead) AS live, "
    + _each("coalesce(max({u}), 0)::bigint AS o_{u}", ", ")
    + ", "
    + _each(
        "greatest(coalesce(max({u}) FILTER (WHERE NOT dead), 0), %(add_{u})s)::bigint AS n_{u}",
        ", ",
    )
    + " FROM g),"
    " b AS (UPDATE {budgets} AS x SET "
    + _each("reserved_{u} = x.reserved_{u} - r.o_{u} + r.n_{u}", ", ")
    + ", updated_at = clock_timestamp() FROM r WHERE x.workflow_id = %(workflow_id)s"
    " AND ((r.live > 0 AND "
    + _each("(%(est_{u})s::bigint IS NULL OR r.n_{u} <= r.o_{u})", " AND ")
    + ") OR ("
    + _each(
        "(x.limit_{u} IS NULL OR %(est_{u})s::bigint IS NULL"
        " OR (x.spent_{u} + x.reserved_{u} - r.o_{u} + r.n_{u} <= x.limit_{u}"
        " AND x.spent_{u} + x.reserved_{u} - r.o_{u} < x.limit_{u}))",
        " AND ",
    )
    + ")) RETURNING x.workflow_id),"
    " dropped AS (DELETE FROM {holds} WHERE hold_id IN (SELECT hold_id FROM g WHERE dead)"
    " AND EXISTS (SELECT 1 FROM b))"
    " INSERT INTO {holds} (hold_id, workflow_id, idem_key, usd_micros, input_tokens,"
    " output_tokens, tool_calls, expires_at)"
    " SELECT %(hold_id)s, workflow_id, %(idem_key)s, %(add_usd_micros)s, %(add_input_tokens)s,"
    " %(add_output_tokens)s, %(add_tool_calls)s,"
    " clock_timestamp() + make_interval(secs => %(ttl_ms)s / 1000.0) FROM b"
)


def _give_back(which: LiteralString) -> LiteralString:
    """The CTEs that delete the holds ``which`` selects (`sel`) and work out
    what ``reserved`` loses (`freed`: per effect, its room minus the largest
    estimate among its holds left; `n` the holds deleted). After BUDGET_LOCK."""
    return (
        "sel AS MATERIALIZED (SELECT hold_id, idem_key FROM {holds}"
        " WHERE workflow_id = %(workflow_id)s AND " + which + "),"
        " g AS MATERIALIZED (SELECT h.idem_key, "
        + _each("h.{u}", ", ")
        + ", h.hold_id IN (SELECT hold_id FROM sel) AS gone FROM {holds} AS h"
        " WHERE h.workflow_id = %(workflow_id)s"
        " AND h.idem_key IN (SELECT idem_key FROM sel)),"
        " per AS (SELECT "
        + _each(
            "coalesce(max({u}), 0) - coalesce(max({u}) FILTER (WHERE NOT gone), 0) AS {u}", ", "
        )
        + " FROM g GROUP BY idem_key),"
        " freed AS (SELECT (SELECT count(*) FROM sel) AS n, "
        + _each("coalesce(sum({u}), 0)::bigint AS {u}", ", ")
        + " FROM per),"
        " gone AS (DELETE FROM {holds} WHERE hold_id IN (SELECT hold_id FROM sel))"
    )


# Booking an effect: one transaction of three statements. BUDGET_LOCK, then
# CHARGE_CLAIM makes sure the effect's charge row exists (zero if new).
# BUDGET_BOOK then, in a fresh snapshot, locks that row (`prev`), raises it
# to the receipt unit by unit (GREATEST: a reopened effect that ran again
# books what it grew by, a replay of the same receipt adds nothing), deletes
# the effect's holds (the caller's, and any other for the same effect, which
# has finished: those made strictly before the booked run finished,
# %(finished_at)s, the effect's completed_at, on this server's clock like
# the holds' created_at; NULL: none) and applies both to the budget row. A
# hold made at that instant or later (a rerun's, after a reopen) keeps its
# room. `n` says whether this call added anything.
CHARGE_CLAIM: Final[LiteralString] = (
    "INSERT INTO {charges} (workflow_id, idem_key, usd_micros, input_tokens, output_tokens,"
    " tool_calls) SELECT workflow_id, %(idem_key)s, 0, 0, 0, 0 FROM {budgets}"
    " WHERE workflow_id = %(workflow_id)s ON CONFLICT (workflow_id, idem_key) DO NOTHING"
)
BUDGET_BOOK: Final[LiteralString] = (
    "WITH prev AS MATERIALIZED (SELECT usd_micros, input_tokens, output_tokens, tool_calls"
    " FROM {charges} WHERE workflow_id = %(workflow_id)s AND idem_key = %(idem_key)s"
    " FOR UPDATE),"
    " raised AS (UPDATE {charges} AS c SET"
    " usd_micros = GREATEST(p.usd_micros, %(add_usd_micros)s),"
    " input_tokens = GREATEST(p.input_tokens, %(add_input_tokens)s),"
    " output_tokens = GREATEST(p.output_tokens, %(add_output_tokens)s),"
    " tool_calls = GREATEST(p.tool_calls, %(add_tool_calls)s), booked_at = clock_timestamp()"
    " FROM prev AS p WHERE c.workflow_id = %(workflow_id)s AND c.idem_key = %(idem_key)s"
    " RETURNING c.usd_micros - p.usd_micros AS usd_micros,"
    " c.input_tokens - p.input_tokens AS input_tokens,"
    " c.output_tokens - p.output_tokens AS output_tokens,"
    " c.tool_calls - p.tool_calls AS tool_calls), "
    + _give_back(
        "(hold_id = %(hold_id)s OR (idem_key = %(idem_key)s"
        " AND created_at < %(finished_at)s::timestamptz))"
    )
    + ", added AS (SELECT coalesce(sum(usd_micros), 0)::bigint AS usd_micros,"
    " coalesce(sum(input_tokens), 0)::bigint AS input_tokens,"
    " coalesce(sum(output_tokens), 0)::bigint AS output_tokens,"
    " coalesce(sum(tool_calls), 0)::bigint AS tool_calls,"
    " count(*) FILTER (WHERE usd_micros + input_tokens + output_tokens + tool_calls > 0)"
    " AS n FROM raised)"
    " UPDATE {budgets} AS b SET "
    + _each("spent_{u} = b.spent_{u} + added.{u}", ", ")
    + ", "
    + _each("reserved_{u} = b.reserved_{u} - freed.{u}", ", ")
    + ", updated_at = clock_timestamp()"
    " FROM freed, added WHERE b.workflow_id = %(workflow_id)s RETURNING added.n"
)
# Giving back the holds `sel` picks: the caller's one (release), or every
# expired one of the budget (reclaim); after BUDGET_LOCK, so each hold is
# given back once.
_GIVEN_BACK: Final[LiteralString] = (
    " UPDATE {budgets} AS b SET "
    + _each("reserved_{u} = b.reserved_{u} - freed.{u}", ", ")
    + ", updated_at = clock_timestamp()"
    " FROM freed WHERE b.workflow_id = %(workflow_id)s AND freed.n > 0 RETURNING freed.n"
)
# Detaching a hold (stores/budget_base.py, detach_hold), after BUDGET_LOCK:
# `h` the hold (not detached already), `per` what its effect's room shrinks
# by without it; the hold is re-keyed to a room of its own (`moved`), and
# reserved loses `per` and gains the hold's estimate. No row: not there.
BUDGET_DETACH: Final[LiteralString] = (
    "WITH h AS MATERIALIZED (SELECT hold_id, idem_key, "
    + _each("{u}", ", ")
    + " FROM {holds} WHERE workflow_id = %(workflow_id)s AND hold_id = %(hold_id)s"
    " AND strpos(idem_key, %(detached)s) = 0),"
    " g AS MATERIALIZED (SELECT x.hold_id, "
    + _each("x.{u}", ", ")
    + " FROM {holds} AS x WHERE x.workflow_id = %(workflow_id)s"
    " AND x.idem_key IN (SELECT idem_key FROM h)),"
    " per AS (SELECT "
    + _each(
        "coalesce(max({u}), 0) - coalesce(max({u}) FILTER (WHERE hold_id <> %(hold_id)s), 0)"
        " AS {u}",
        ", ",
    )
    + " FROM g),"
    " moved AS (UPDATE {holds} AS x SET idem_key = x.idem_key || %(detached)s || x.hold_id"
    " FROM h WHERE x.hold_id = h.hold_id RETURNING x.hold_id)"
    " UPDATE {budgets} AS b SET "
    + _each("reserved_{u} = b.reserved_{u} - per.{u} + h.{u}", ", ")
    + ", updated_at = clock_timestamp()"
    " FROM per, h WHERE b.workflow_id = %(workflow_id)s RETURNING h.hold_id"
)
BUDGET_RELEASE: Final[LiteralString] = "WITH " + _give_back("hold_id = %(hold_id)s") + _GIVEN_BACK
BUDGET_RECLAIM: Final[LiteralString] = (
    "WITH " + _give_back("expires_at <= clock_timestamp()") + _GIVEN_BACK
)

# -- approvals (schema version 4; see stores/approval_base.py) --
# {approvals}, {attempts}, {links}: the qualified tables.
_REQUEST_COLUMNS: Final[LiteralString] = (
    "idem_key, requested_by, policy_version, deadline_at, escalated_at, created_at"
)
# note_request: insert-or-get in one statement; the first request's asker,
# policy version and deadline stand (a second request returns them).
APPROVAL_NOTE: Final[LiteralString] = (
    "WITH ins AS (INSERT INTO {approvals} (idem_key, requested_by, policy_version, deadline_at)"
    " VALUES (%(idem_key)s, %(requested_by)s, %(policy_version)s,"
    " clock_timestamp() + %(deadline_ms)s::bigint * interval '1 millisecond')"
    " ON CONFLICT (idem_key) DO NOTHING RETURNING " + _REQUEST_COLUMNS + ") "
    "SELECT " + _REQUEST_COLUMNS + " FROM ins UNION ALL "
    "SELECT " + _REQUEST_COLUMNS + " FROM {approvals} WHERE idem_key = %(idem_key)s"
    " AND NOT EXISTS (SELECT 1 FROM ins)"
)
APPROVAL_GET: Final[LiteralString] = (
    "SELECT " + _REQUEST_COLUMNS + " FROM {approvals} WHERE idem_key = %(idem_key)s"
)
# renew_request: a new request replaces the old (asker, policy, deadline from
# now; not escalated yet).
APPROVAL_RENEW: Final[LiteralString] = (
    "INSERT INTO {approvals} (idem_key, requested_by, policy_version, deadline_at)"
    " VALUES (%(idem_key)s, %(requested_by)s, %(policy_version)s,"
    " clock_timestamp() + %(deadline_ms)s::bigint * interval '1 millisecond')"
    " ON CONFLICT (idem_key) DO UPDATE SET requested_by = EXCLUDED.requested_by,"
    " policy_version = EXCLUDED.policy_version, deadline_at = EXCLUDED.deadline_at,"
    " escalated_at = NULL, created_at = clock_timestamp()"
    " RETURNING " + _REQUEST_COLUMNS
)
_A_REQUEST_COLUMNS: Final[LiteralString] = (
    "a.idem_key, a.requested_by, a.policy_version, a.deadline_at, a.escalated_at, a.created_at"
)
# The requests whose effect still waits for an approval (not parked: an
# ambiguous attempt is never denied by a clock).
_WAITING_REQUESTS: Final[LiteralString] = (
    " FROM {approvals} AS a JOIN {effects} AS e ON e.idem_key = a.idem_key"
    " WHERE e.status = %(waiting)s"
    " AND (e.error->>'code') IS DISTINCT FROM %(ambiguous)s AND a.deadline_at IS NOT NULL"
)
APPROVALS_OVERDUE: Final[LiteralString] = (
    "SELECT " + _A_REQUEST_COLUMNS + _WAITING_REQUESTS + " AND a.deadline_at <= clock_timestamp()"
    " ORDER BY a.deadline_at, a.idem_key LIMIT %(limit)s"
)
# escalations_due: not escalated, deadline ahead, ``fraction`` of the wait used.
ESCALATIONS_DUE: Final[LiteralString] = (
    "SELECT " + _A_REQUEST_COLUMNS + _WAITING_REQUESTS + " AND a.escalated_at IS NULL"
    " AND a.deadline_at > clock_timestamp()"
    " AND a.created_at + (a.deadline_at - a.created_at) * %(fraction)s::float8"
    " <= clock_timestamp()"
    " ORDER BY a.deadline_at, a.idem_key LIMIT %(limit)s"
)
# mark_escalated: once per request (its created_at names it).
ESCALATION_MARK: Final[LiteralString] = (
    "UPDATE {approvals} SET escalated_at = clock_timestamp()"
    " WHERE idem_key = %(idem_key)s AND escalated_at IS NULL AND created_at = %(created_at)s"
)
# decide, first statement: consume the link's nonce. A concurrent decide with
# the same nonce waits on the primary key until this transaction ends, then
# inserts nothing (the link has decided) or, if it rolled back, takes it.
LINK_CONSUME: Final[LiteralString] = (
    "INSERT INTO {links} (nonce, idem_key, action, used_by, expires_at)"
    " VALUES (%(nonce)s, %(idem_key)s, %(action)s, %(used_by)s, %(expires_at)s)"
    " ON CONFLICT (nonce) DO NOTHING RETURNING nonce"
)
# record_attempt, and decide's accepted row: one row of the audit trail.
ATTEMPT_INSERT: Final[LiteralString] = (
    "INSERT INTO {attempts} (idem_key, principal, channel, action, outcome, reason_code,"
    " intent_hash, note) VALUES (%(a_idem_key)s, %(a_principal)s, %(a_channel)s,"
    " %(a_action)s, %(a_outcome)s, %(a_reason)s, %(a_intent)s, %(a_note)s)"
)
_ATTEMPT_COLUMNS: Final[LiteralString] = (
    "id, idem_key, principal, channel, action, outcome, reason_code, intent_hash, note, at"
)
ATTEMPTS_OF: Final[LiteralString] = (
    "SELECT " + _ATTEMPT_COLUMNS + " FROM {attempts} WHERE idem_key = %(idem_key)s"
    " ORDER BY id LIMIT %(limit)s"
)
ATTEMPTS_ALL: Final[LiteralString] = (
    "SELECT " + _ATTEMPT_COLUMNS + " FROM {attempts} ORDER BY id LIMIT %(limit)s"
)

# -- roles (postgres_roles.sql; opt-in, not a schema version) --
# Installing takes turns with migrate() and other installers, as migrate does.
ROLES_LOCK: Final[LiteralString] = "SELECT pg_advisory_xact_lock(hashtext('agent_ledger_schema'))"
# {settings}: the one-row agent_ledger_roles table. Saving keeps the stored
# separate_duty when the caller passes NULL (init --roles without the flag).
ROLES_SAVE: Final[LiteralString] = (
    "INSERT INTO {settings} AS s (owner_role, worker_role, approver_role, separate_duty)"
    " VALUES (%(owner)s, %(worker)s, %(approver)s, coalesce(%(separate_duty)s::boolean, false))"
    " ON CONFLICT (one) DO UPDATE SET owner_role = EXCLUDED.owner_role,"
    " worker_role = EXCLUDED.worker_role, approver_role = EXCLUDED.approver_role,"
    " separate_duty = coalesce(%(separate_duty)s::boolean, s.separate_duty),"
    " updated_at = clock_timestamp()"
    " RETURNING owner_role, worker_role, approver_role, separate_duty"
)
ROLES_READ: Final[LiteralString] = (
    "SELECT owner_role, worker_role, approver_role, separate_duty FROM {settings}"
)
