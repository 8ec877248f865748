"""Every SQL statement SqliteStore runs, one per ledger step, in one place.

Each statement is a ``:name`` parameter query (``?`` for the single-key
lookups); statuses are parameters too (they come from ``EffectStatus``,
never retyped here). Times are integer microseconds since the Unix epoch
(``*_us`` columns, see ``_columns``); ``:now`` is the store's clock, read by
``SqliteStore._run`` under the write lock.

Atomicity comes from the transaction around each step, not from the
statement: outside a caller's transaction, every writing step runs in its
own ``BEGIN IMMEDIATE`` transaction, which takes the database's write lock
before the first read. So a step's statements (an ``UPDATE`` and the
``SELECT`` that reads the result back, say) see no other writer in
between, in this process or any other.
"""

from __future__ import annotations

from typing import Final

from agent_ledger.fields import TIME_FIELDS
from agent_ledger.stores._columns import select_list

# How SQLite keeps the fields it does not keep as-is (see _columns): every time
# is integer microseconds in a *_us column; the error is already two columns.
_EXPRESSIONS: Final = {name: name.removesuffix("_at") + "_us" for name in TIME_FIELDS}
#: The columns every effect query returns, in the order ``effect_from_row`` reads them.
EFFECT_COLUMNS: Final = select_list(_EXPRESSIONS)

# -- opening a database --
# PRAGMAs take no parameters: the values are formatted in as checked integers
# or one of two fixed words (SqliteStore validates `synchronous`).
# busy_timeout makes a writer that finds the database locked wait for it
# instead of failing at once; WAL lets readers run beside the one writer.
BUSY_TIMEOUT: Final = "PRAGMA busy_timeout = {ms:d}"
JOURNAL_MODE: Final = "PRAGMA journal_mode = WAL"
SYNCHRONOUS: Final = "PRAGMA synchronous = {level}"
# With create=False: is the effects table there? (The schema itself is sqlite_schema.sql.)
HAS_EFFECTS_TABLE: Final = "SELECT 1 FROM sqlite_master WHERE name = 'agent_ledger_effects'"

# -- schema --
# Is there a version marker yet? (A new file has none: version 0.)
HAS_VERSIONS_TABLE: Final = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'agent_ledger_schema_version'"
)
# The newest version sqlite_schema.sql has recorded in its marker table.
SCHEMA_VERSION: Final = "SELECT max(version) FROM agent_ledger_schema_version"

# -- transactions --
# IMMEDIATE takes the write lock up front: two processes can never both read
# "absent" or "claimable" and then both write.
TX_BEGIN: Final = "BEGIN IMMEDIATE"
TX_COMMIT: Final = "COMMIT"
TX_ROLLBACK: Final = "ROLLBACK"
# A caller's transaction() marks where its block starts, so that a block that
# does not commit can be undone while the write lock is still held (the
# leases of others are paused before the lock goes: see _transactions.py).
TX_BLOCK: Final = "SAVEPOINT agent_ledger_block"
TX_UNDO_BLOCK: Final = "ROLLBACK TO SAVEPOINT agent_ledger_block"
# When a transaction that held the write lock for held_us ends: nobody could
# heartbeat meanwhile, so the effects held since before it keep the lease they
# had when it began (see stores/_transactions.py). Uses the open index.
PAUSE_LEASES: Final = (
    "UPDATE agent_ledger_effects SET heartbeat_us = heartbeat_us + :held_us"
    " WHERE status = :processing AND heartbeat_us < :opened_us"
)

# -- begin --
# First FIND alone, outside any transaction: a WAL reader, which never takes
# (or waits for) the write lock. A finished effect ends it there (a replay:
# its duplicate is counted later, in a batch, DEDUP_FLUSH). Any other answer
# goes on to insert-or-get under the write lock, as before the fast path: a
# new key is inserted as processing (the first execution), or straight into
# requires_approval for a call that needs approval, attempt 1 (the column
# default), with its creator's lease; for an existing one the insert does
# nothing (rowcount 0), and COUNT_DUPLICATE adds 1 to dedup_count and
# nothing else (never the heartbeat: duplicates must not keep a dead
# worker's effect looking alive). FIND then reads the effect back.
INSERT: Final = (
    "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, call_id, tool, status,"
    " args_canonical, resource_id_canonical, lease_ms, executions, created_us, updated_us,"
    " heartbeat_us, started_us, history)"
    " VALUES (:id, :idem_key, :workflow_id, :call_id, :tool, :status, :args_canonical,"
    " :resource_id_canonical, :lease_ms, :executions, :now, :now, :now,"
    " CASE WHEN :executions > 0 THEN :now END, :history)"
    " ON CONFLICT (idem_key) DO NOTHING"
)
COUNT_DUPLICATE: Final = (
    "UPDATE agent_ledger_effects SET dedup_count = dedup_count + 1 WHERE idem_key = :idem_key"
)

# -- duplicate counts --
# Every effect this store counted duplicates of since the last flush, in one
# statement: :batch is a JSON object {effect id: increment}. By id, not key: a
# key purged and used again by a new effect must not get the old one's counts;
# an effect that is gone (purged) matches no row. The count alone is read back by DEDUP_COUNTS
# (:ids a JSON array) after a read overlapped a flush (see stores/_dedup.py).
DEDUP_FLUSH: Final = (
    "UPDATE agent_ledger_effects AS e SET dedup_count = e.dedup_count + b.value"
    " FROM json_each(:batch) AS b WHERE e.id = b.key"
)
DEDUP_COUNTS: Final = (
    "SELECT id, dedup_count FROM agent_ledger_effects WHERE id IN (SELECT value FROM json_each(?))"
)

# -- claim --
# Take the effect from any status in :claimable (status.CLAIMABLE as a JSON
# array: ready, and processing itself), but from processing only when its
# heartbeat is older than the holder's lease, and than the caller's stale_ms,
# by the store's clock: a takeover (0 on either side: never), and never of an
# attempt whose handler started under on_stale="park" (PARK takes those). The
# heartbeat is the later of the stored one and :seen_us, the time of the
# holder's file (stores/_sqlite_holders.py: a heartbeat that needs no write
# lock; 0 when it has none), read by HOLDING under the same lock. +1 attempt
# fences the previous holder; the caller's lease_ms becomes the new holder's
# lease. The write lock makes the check and the
# update one step, so of concurrent claims exactly one changes a row
# (rowcount 1); FIND then reads the effect as it stands, claimed or not.
CLAIM: Final = (
    "UPDATE agent_ledger_effects SET status = :processing, attempt = attempt + 1,"
    " executions = executions + 1, lease_ms = :lease_ms,"
    " heartbeat_us = :now, started_us = :now, updated_us = :now"
    " WHERE idem_key = :idem_key AND status IN (SELECT value FROM json_each(:claimable))"
    " AND (status <> :processing OR (:stale_ms > 0 AND lease_ms > 0"
    " AND max(heartbeat_us, :seen_us) <= :now - max(lease_ms, :stale_ms) * 1000"
    " AND park_attempt IS NOT attempt))"
)
# Who holds the key now, if anyone: the holding whose file CLAIM and PARK read.
HOLDING: Final = "SELECT id, attempt FROM agent_ledger_effects WHERE idem_key = ? AND status = ?"
# Of some holdings (:holdings, a JSON array of [id, attempt]), those still
# held: purge() removes the files of the rest.
STILL_HELD: Final = (
    "SELECT e.id, e.attempt FROM agent_ledger_effects AS e"
    " JOIN json_each(:holdings) AS h ON e.id = json_extract(h.value, '$[0]')"
    " AND e.attempt = json_extract(h.value, '$[1]') WHERE e.status = :processing"
)

# -- heartbeat --
# Refresh liveness only for the holder: still processing, same attempt. Run
# once per effect of a batch, all inside one write transaction.
HEARTBEAT: Final = (
    "UPDATE agent_ledger_effects SET heartbeat_us = :now"
    " WHERE id = :id AND status = :processing AND attempt = :attempt"
)

# -- commit --
# Compare-and-set processing -> succeeded/failed/canceled on (id, status,
# attempt): the first commit wins, and a late commit from an older attempt
# matches no row. A NULL attempt skips the fencing check (unfenced commit()).
# :unstarted (0 or 1) takes back the claim's execution when the attempt's
# handler never started (executions counts handler starts).
# KEY_OF then names the key whose waiters to wake.
# A time kept in µs as the ISO 8601 text the history's events hold (exact to
# the µs, UTC), for the values the statement reads from the row itself.
_ISO_US: Final = (
    "(strftime('%Y-%m-%dT%H:%M:%S', {col} / 1000000, 'unixepoch')"
    " || printf('.%06d+00:00', {col} % 1000000))"
)
# With :retryable (a failure its tool declared retryable) the failure is also
# appended to the history as a RetryableFailure of this attempt, in the same
# step: that is what lets a later call run it again (RETRY_FAILED).
COMMIT: Final = (
    "UPDATE agent_ledger_effects SET status = :status, result = :result, usage = :usage,"
    " error_message = :error_message, error_code = :error_code, tries = tries + :tried,"
    " executions = executions - :unstarted, completed_us = :now, updated_us = :now,"
    " history = CASE WHEN :retryable THEN json_insert(history, '$[#]', json_object('kind',"
    " :retryable_kind, 'attempt', attempt, 'message', :error_message, 'code', :error_code,"
    " 'at', " + _ISO_US.format(col=":now") + ")) ELSE history END"
    " WHERE id = :id AND status = :processing AND (:attempt IS NULL OR attempt = :attempt)"
)

# -- record_try --
# One failed try of a retried handler, fenced like a commit on (id, status,
# attempt) but leaving the status as it is: +1 try, and the try's failure
# (:event, JSON text from _params) appended to the history with its number
# (the new count: SET reads the row's old values) and the store's time
# (:at, ISO 8601 from :now). The holder is alive: its heartbeat too.
RECORD_TRY: Final = (
    "UPDATE agent_ledger_effects SET tries = tries + 1,"
    " history = json_insert(history, '$[#]', json_set(json(:event), '$.try', tries + 1,"
    " '$.at', :at)),"
    " heartbeat_us = :now"
    " WHERE id = :id AND status = :processing AND attempt = :attempt"
)
KEY_OF: Final = "SELECT idem_key FROM agent_ledger_effects WHERE id = ?"

# -- release --
# Compare-and-set processing -> ready on (id, status, attempt): the holder gives
# the effect back before its handler started, so the claim's execution is taken
# back (started_us cleared when none is left; SET reads the row's old values).
# Heartbeat and lease stay. KEY_OF then names the key whose waiters to wake.
RELEASE: Final = (
    "UPDATE agent_ledger_effects SET status = :ready, executions = executions - 1,"
    " started_us = CASE WHEN executions = 1 THEN NULL ELSE started_us END,"
    " updated_us = :now"
    " WHERE id = :id AND status = :processing AND attempt = :attempt"
)

# -- transition --
# Compare-and-set by key from any allowed source status (request_approval,
# approve, deny, cancel); :sources is a JSON array of status values. The
# error (a decision's reason) is kept when given, and so is who decided;
# completed_us is set when the target is terminal. FIND reads the result back.
TRANSITION: Final = (
    "UPDATE agent_ledger_effects SET status = :target, updated_us = :now,"
    " error_message = CASE WHEN :has_error THEN :error_message ELSE error_message END,"
    " error_code = CASE WHEN :has_error THEN :error_code ELSE error_code END,"
    " decided_by = CASE WHEN :decided THEN :decided_by ELSE decided_by END,"
    " decision_note = CASE WHEN :decided THEN :decision_note ELSE decision_note END,"
    " decided_us = CASE WHEN :decided THEN :now ELSE decided_us END,"
    " completed_us = CASE WHEN :terminal THEN :now ELSE completed_us END"
    " WHERE idem_key = :idem_key AND status IN (SELECT value FROM json_each(:sources))"
)

# -- reopen --
# Compare-and-set by key from failed or canceled (:sources, a JSON array) to
# ready. How the effect had ended (status, error, tries) goes to the history
# with who reopened it, why and when (SET reads the row's old values); the
# error and completion are cleared, the tries start again, and the reopening
# is the latest decision. The attempt stays: the next claim moves it on.
REOPEN: Final = (
    "UPDATE agent_ledger_effects SET status = :ready,"
    " history = json_insert(history, '$[#]', json_object('kind', :kind, 'status', status,"
    " 'error', json(CASE WHEN error_message IS NOT NULL"
    " THEN json_object('message', error_message, 'code', error_code) END),"
    " 'tries', tries, 'by', :by, 'reason', :reason, 'at', :at)),"
    " error_message = NULL, error_code = NULL, tries = 0, completed_us = NULL,"
    " decided_by = :by, decision_note = :reason, decided_us = :now, updated_us = :now"
    " WHERE idem_key = :idem_key AND status IN (SELECT value FROM json_each(:sources))"
)

# -- retry_failed --
# Compare-and-set failed -> processing at exactly :attempt (the failure the
# caller read), for a later call after a retryable failure: of concurrent
# callers exactly one changes the row (rowcount 1). Like a claim: attempt + 1,
# one more execution, the caller's lease, heartbeat and start now; like a
# reopen: the outcome (result, usage, error, completion) cleared and the tries
# counted afresh. The history keeps the failure. FIND then reads the effect.
RETRY_FAILED: Final = (
    "UPDATE agent_ledger_effects SET status = :processing, attempt = attempt + 1,"
    " executions = executions + 1, lease_ms = :lease_ms, result = NULL, usage = NULL,"
    " error_message = NULL, error_code = NULL, tries = 0, completed_us = NULL,"
    " heartbeat_us = :now, started_us = :now, updated_us = :now"
    " WHERE idem_key = :idem_key AND status = :failed AND attempt = :attempt"
)

# -- ambiguous attempts (schema version 3) --
# mark_started: a run under on_stale="park" records, fenced by its attempt,
# that its handler starts now, and who runs it. A sign of life too.
MARK_STARTED: Final = (
    "UPDATE agent_ledger_effects SET park_attempt = attempt, worker = :worker,"
    " heartbeat_us = :now"
    " WHERE id = :id AND status = :processing AND attempt = :attempt"
)
# park: processing -> requires_approval, only for the attempt whose handler
# was recorded as started under park, and only once its holder has been
# silent for the longer of its lease and :stale_ms (0 on either side: never),
# as a takeover would judge it (the holder's file too, as in CLAIM). The
# reason goes to the error; the history keeps which attempt, when it started,
# who ran it, its last heartbeat and when it was parked (SET reads the row's
# old values). The attempt stays: it is the one a person settles. FIND then
# reads the effect as it stands.
PARK: Final = (
    "UPDATE agent_ledger_effects SET status = :requires_approval,"
    " error_message = :error_message, error_code = :error_code, updated_us = :now,"
    " history = json_insert(history, '$[#]', json_object('kind', :kind, 'attempt', attempt,"
    " 'started_at', CASE WHEN started_us IS NOT NULL THEN "
    + _ISO_US.format(col="started_us")
    + " END, 'worker', worker, 'heartbeat_at', "
    + _ISO_US.format(col="heartbeat_us")
    + ", 'at', :at))"
    " WHERE idem_key = :idem_key AND status = :processing AND park_attempt = attempt"
    " AND :stale_ms > 0 AND lease_ms > 0"
    " AND max(heartbeat_us, :seen_us) <= :now - max(lease_ms, :stale_ms) * 1000"
)
# settle: a person's approve, deny or resolve, requires_approval -> :target,
# at the attempt they saw (:expected_attempt; NULL: any) and, for resolve,
# only a parked effect. The error and result become what the decision says
# (approve clears a park's reason); the history keeps who, the attempt, the
# note and when, and the decision is the latest one.
SETTLE: Final = (
    "UPDATE agent_ledger_effects SET status = :target, result = :result,"
    " error_message = :error_message, error_code = :error_code,"
    " history = json_insert(history, '$[#]', json_object('kind', :kind, 'status', :target,"
    " 'attempt', attempt, 'by', :decided_by, 'note', :decision_note, 'at', :at)),"
    " decided_by = :decided_by, decision_note = :decision_note, decided_us = :now,"
    " completed_us = CASE WHEN :terminal THEN :now ELSE completed_us END, updated_us = :now,"
    " tries = CASE WHEN :fresh_tries AND error_code IS :ambiguous THEN 0 ELSE tries END"
    " WHERE idem_key = :idem_key AND status = :requires_approval"
    " AND (:expected_attempt IS NULL OR attempt = :expected_attempt)"
    " AND (NOT :only_parked OR error_code IS :ambiguous)"
    # Past the request's deadline only a denial.
    " AND (:ignores_deadline OR NOT EXISTS (SELECT 1 FROM agent_ledger_approvals AS a"
    " WHERE a.idem_key = agent_ledger_effects.idem_key AND a.deadline_us <= :now))"
)

# -- get / find --
GET: Final = "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects WHERE id = ?"
FIND: Final = "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects WHERE idem_key = ?"

# -- find_legacy / record_legacy --
# The effect a 0.2.x key was imported as: two primary-key reads in one
# statement. A mapping whose effect was purged finds nothing.
FIND_LEGACY: Final = (
    "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects WHERE idem_key = "
    "(SELECT idem_key FROM agent_ledger_legacy_keys WHERE legacy_key = ?)"
)
# The first mapping of a 0.2.x key stays (a second import changes nothing).
RECORD_LEGACY: Final = (
    "INSERT INTO agent_ledger_legacy_keys (legacy_key, idem_key) VALUES (?, ?) "
    "ON CONFLICT (legacy_key) DO NOTHING"
)

# -- list_effects --
# The audit trail, newest first. Only the filters the caller gave are joined
# into the WHERE clause (fragments below, never caller text), so each
# combination can use its index; `before` is the keyset position.
LIST: Final = "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects"
# Handler time in µs (effects.handler_time, which says why): from the run's
# start to its recorded end, or to :now while it runs; NULL (never matching)
# when no run's end is known.
HANDLER_TIME: Final = (
    "(CASE WHEN started_us IS NULL OR decided_us > started_us THEN NULL"
    " WHEN status = :processing THEN :now - started_us"
    " WHEN status IN (SELECT value FROM json_each(:run_ends))"
    " THEN completed_us - started_us END)"
)
LIST_FILTERS: Final = {
    "workflow_id": "workflow_id = :workflow_id",
    "tool": "tool = :tool",
    "status": "status = :status",
    "since": "created_us >= :since",
    "until": "created_us < :until",
    "before": "(created_us < :before_at OR (created_us = :before_at AND id < :before_id))",
    # A range rather than LIKE (which ignores case in SQLite), so the unique
    # index on idem_key serves it: keys are lowercase hex and 'g' sorts after 'f'.
    "idem_key_prefix": "idem_key >= :idem_key_prefix AND idem_key < :idem_key_prefix || 'g'",
    "call_id": "call_id = :call_id",
    "error_code": "error_code = :error_code",
    "min_duration": HANDLER_TIME + " >= :min_duration_us",
    "max_duration": HANDLER_TIME + " <= :max_duration_us",
}
LIST_ORDER: Final = " ORDER BY created_us DESC, id DESC LIMIT :limit"

# -- stats --
# One pass over the table: counts and duplicates per (status, tool).
STATS: Final = (
    "SELECT status, tool, count(*), coalesce(sum(dedup_count), 0)"
    " FROM agent_ledger_effects GROUP BY status, tool"
)

# -- purge --
# Retention: terminal effects (the caller passes only terminal statuses, as a
# JSON array) completed at or before :cutoff by the store's clock.
PURGE: Final = (
    "DELETE FROM agent_ledger_effects WHERE status IN (SELECT value FROM json_each(:statuses))"
    " AND completed_us <= :cutoff"
    # A saga's step or undo stays (sagas are never purged; see PostgreSQL's PURGE).
    " AND NOT EXISTS (SELECT 1 FROM agent_ledger_saga_steps s"
    " WHERE s.idem_key = agent_ledger_effects.idem_key"
    " OR s.compensation_key = agent_ledger_effects.idem_key)"
)

# -- sagas (schema version 3; see stores/saga_base.py) --
# Each runs under the write lock like every other writing step, so a check
# and the write after it are one step.
SAGA_COLUMNS: Final = (
    "saga_id, status, attempt, owner, lease_ms, heartbeat_us, abandon_after_ms,"
    " on_compensation_failure, error_message, error_code, created_us, updated_us, completed_us"
)
STEP_COLUMNS: Final = (
    "saga_id, position, group_index, tool, idem_key, compensation, compensation_key,"
    " compensate_if, created_us"
)
# Insert-or-get: a new id is inserted running at attempt 1 (rowcount 1);
# SAGA_GET then reads it back either way.
SAGA_INSERT: Final = (
    "INSERT INTO agent_ledger_sagas (saga_id, status, owner, lease_ms, heartbeat_us,"
    " abandon_after_ms, on_compensation_failure, created_us, updated_us)"
    " VALUES (:saga_id, :status, :owner, :lease_ms, :now, :abandon_after_ms,"
    " :on_compensation_failure, :now, :now)"
    " ON CONFLICT (saga_id) DO NOTHING"
)
SAGA_GET: Final = "SELECT " + SAGA_COLUMNS + " FROM agent_ledger_sagas WHERE saga_id = ?"
# A takeover: from :expect, only when the heartbeat is older than both the
# holder's lease and :idle_ms (a lease of 0 is never taken over). +1 attempt
# fences the old owner out of every later saga step.
SAGA_CLAIM: Final = (
    "UPDATE agent_ledger_sagas SET status = :then, attempt = attempt + 1, owner = :owner,"
    " lease_ms = :lease_ms, heartbeat_us = :now, updated_us = :now"
    " WHERE saga_id = :saga_id AND status = :expect AND lease_ms > 0"
    " AND heartbeat_us <= :now - max(lease_ms, :idle_ms) * 1000"
)
SAGA_HEARTBEAT: Final = (
    "UPDATE agent_ledger_sagas SET heartbeat_us = :now"
    " WHERE saga_id = :saga_id AND attempt = :attempt"
    " AND status IN (SELECT value FROM json_each(:open))"
)
SAGA_RELEASE: Final = (
    "UPDATE agent_ledger_sagas SET heartbeat_us = 0"
    " WHERE saga_id = :saga_id AND attempt = :attempt AND status = :compensating"
)
# The owner's own move, fenced by its attempt; an error given replaces the stored one.
SAGA_FINISH: Final = (
    "UPDATE agent_ledger_sagas SET status = :then, heartbeat_us = :now, updated_us = :now,"
    " error_message = CASE WHEN :has_error THEN :error_message ELSE error_message END,"
    " error_code = CASE WHEN :has_error THEN :error_code ELSE error_code END,"
    " completed_us = CASE WHEN :terminal THEN :now END"
    " WHERE saga_id = :saga_id AND attempt = :attempt AND status = :expect"
)
# Is the caller still the owner of the running saga? Read under the write
# lock, so no claim can come between it and STEP_INSERT.
SAGA_OWNS_RUNNING: Final = (
    "SELECT 1 FROM agent_ledger_sagas"
    " WHERE saga_id = :saga_id AND attempt = :attempt AND status = :running"
)
STEP_INSERT: Final = (
    "INSERT INTO agent_ledger_saga_steps (saga_id, position, group_index, tool, idem_key,"
    " compensation, compensation_key, compensate_if, created_us)"
    " VALUES (:saga_id, :position, :group_index, :tool, :idem_key, :compensation,"
    " :compensation_key, :compensate_if, :now)"
    " ON CONFLICT (saga_id, position) DO NOTHING"
)
STEP_GET: Final = (
    "SELECT " + STEP_COLUMNS + " FROM agent_ledger_saga_steps"
    " WHERE saga_id = :saga_id AND position = :position"
)
SAGA_STEPS: Final = (
    "SELECT " + STEP_COLUMNS + " FROM agent_ledger_saga_steps WHERE saga_id = ? ORDER BY position"
)
SAGA_LIST: Final = (
    "SELECT " + SAGA_COLUMNS + " FROM agent_ledger_sagas"
    " WHERE :statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses))"
    " ORDER BY created_us DESC, saga_id DESC LIMIT :limit"
)
# What a recoverer's SAGA_CLAIM would take now, oldest first, after a cursor.
# The statuses are written out, not bound: only then may SQLite use the
# partial index of open sagas rather than read every saga ever finished.
SAGA_CLAIMABLE: Final = (
    "SELECT " + SAGA_COLUMNS + " FROM agent_ledger_sagas WHERE lease_ms > 0"
    " AND status IN ('running', 'compensating')"
    " AND ((status = 'compensating' AND heartbeat_us <= :now - lease_ms * 1000)"
    " OR (status = 'running' AND abandon_after_ms IS NOT NULL"
    " AND heartbeat_us <= :now - max(lease_ms, abandon_after_ms) * 1000))"
    " AND (:after_us IS NULL OR created_us > :after_us"
    " OR (created_us = :after_us AND saga_id > :after_id))"
    " ORDER BY created_us, saga_id LIMIT :limit"
)

# -- budgets (schema version 3; see stores/budget_base.py) --
# Each step runs in one BEGIN IMMEDIATE transaction (SqliteStore._run), so
# its check and its writes see no other writer in between: the same
# atomicity PostgreSQL gets from its single statements.
BUDGET_COLUMNS: Final = (
    "b.workflow_id, b.limit_usd_micros, b.limit_input_tokens, b.limit_output_tokens,"
    " b.limit_tool_calls, b.spent_usd_micros, b.spent_input_tokens, b.spent_output_tokens,"
    " b.spent_tool_calls, b.reserved_usd_micros, b.reserved_input_tokens,"
    " b.reserved_output_tokens, b.reserved_tool_calls,"
    " (SELECT count(DISTINCT h.idem_key) FROM agent_ledger_budget_holds AS h"
    " WHERE h.workflow_id = b.workflow_id),"
    " b.created_us, b.updated_us"
)
BUDGET_INSERT: Final = (
    "INSERT INTO agent_ledger_budgets (workflow_id, limit_usd_micros, limit_input_tokens,"
    " limit_output_tokens, limit_tool_calls, created_us, updated_us)"
    " VALUES (:workflow_id, :limit_usd_micros, :limit_input_tokens, :limit_output_tokens,"
    " :limit_tool_calls, :now, :now)"
    " ON CONFLICT (workflow_id) DO NOTHING"
)
BUDGET_GET: Final = (
    "SELECT " + BUDGET_COLUMNS + " FROM agent_ledger_budgets AS b WHERE b.workflow_id = ?"
)
BUDGET_LIST: Final = (
    "SELECT " + BUDGET_COLUMNS + " FROM agent_ledger_budgets AS b"
    " ORDER BY b.updated_us DESC, b.workflow_id DESC LIMIT :limit"
)
HOLD_INSERT: Final = (
    "INSERT INTO agent_ledger_budget_holds (hold_id, workflow_id, idem_key, usd_micros,"
    " input_tokens, output_tokens, tool_calls, created_us, expires_us)"
    " VALUES (:hold_id, :workflow_id, :idem_key, :add_usd_micros, :add_input_tokens,"
    " :add_output_tokens, :add_tool_calls, :now, :now + :ttl_ms * 1000)"
)
# The holds a step gives back (their effects' rooms worked out in Python,
# _sqlite_budgets._give_back), and the holds of one effect.
HOLD_ROWS: Final = (
    "SELECT hold_id, idem_key, usd_micros, input_tokens, output_tokens, tool_calls, expires_us"
    " FROM agent_ledger_budget_holds WHERE workflow_id = :workflow_id AND "
)
# A booking's holds: the caller's, and the effect's made strictly before the
# booked run finished (:finished_us; NULL: none), so a rerun's hold made
# after a reopen keeps its room.
OF_EFFECT: Final = "(hold_id = :hold_id OR (idem_key = :idem_key AND created_us < :finished_us))"
OF_KEY: Final = "idem_key = :idem_key"
ONE_HOLD: Final = "hold_id = :hold_id"
EXPIRED: Final = "expires_us <= :now"
# Detaching a hold: into a room of its own (stores/budget_base.py, detach_hold).
HOLD_REKEY: Final = (
    "UPDATE agent_ledger_budget_holds SET idem_key = :new_key"
    " WHERE workflow_id = :workflow_id AND hold_id = :hold_id"
)
DELETE_HOLD_ONE: Final = (
    "DELETE FROM agent_ledger_budget_holds WHERE workflow_id = :workflow_id AND hold_id = :hold_id"
)
# A charge, one row per (budget, idem key): what was booked for that effect.
# A later booking raises it to the larger receipt, unit by unit (CHARGE_RAISE),
# and the budget's spent grows by the difference.
CHARGE_GET: Final = (
    "SELECT usd_micros, input_tokens, output_tokens, tool_calls"
    " FROM agent_ledger_budget_charges WHERE workflow_id = :workflow_id AND idem_key = :idem_key"
)
CHARGE_RAISE: Final = (
    "UPDATE agent_ledger_budget_charges SET usd_micros = :add_usd_micros,"
    " input_tokens = :add_input_tokens, output_tokens = :add_output_tokens,"
    " tool_calls = :add_tool_calls, booked_us = :now"
    " WHERE workflow_id = :workflow_id AND idem_key = :idem_key"
)
CHARGE_INSERT: Final = (
    "INSERT INTO agent_ledger_budget_charges (workflow_id, idem_key, usd_micros, input_tokens,"
    " output_tokens, tool_calls, booked_us)"
    " SELECT workflow_id, :idem_key, :add_usd_micros, :add_input_tokens, :add_output_tokens,"
    " :add_tool_calls, :now FROM agent_ledger_budgets WHERE workflow_id = :workflow_id"
    " ON CONFLICT (workflow_id, idem_key) DO NOTHING"
)
# What was booked (:spent_*, zero when nothing was) and given back (:freed_*).
BUDGET_APPLY: Final = (
    "UPDATE agent_ledger_budgets SET"
    " spent_usd_micros = spent_usd_micros + :spent_usd_micros,"
    " spent_input_tokens = spent_input_tokens + :spent_input_tokens,"
    " spent_output_tokens = spent_output_tokens + :spent_output_tokens,"
    " spent_tool_calls = spent_tool_calls + :spent_tool_calls,"
    " reserved_usd_micros = reserved_usd_micros - :freed_usd_micros,"
    " reserved_input_tokens = reserved_input_tokens - :freed_input_tokens,"
    " reserved_output_tokens = reserved_output_tokens - :freed_output_tokens,"
    " reserved_tool_calls = reserved_tool_calls - :freed_tool_calls, updated_us = :now"
    " WHERE workflow_id = :workflow_id"
)

# -- approvals (schema version 4; see stores/approval_base.py) --
_REQUEST_COLUMNS: Final = (
    "idem_key, requested_by, policy_version, deadline_us, escalated_us, created_us"
)
# note_request: insert-or-get; the first request's asker and deadline stand.
APPROVAL_INSERT: Final = (
    "INSERT INTO agent_ledger_approvals"
    " (idem_key, requested_by, policy_version, deadline_us, created_us)"
    " VALUES (:idem_key, :requested_by, :policy_version,"
    " CASE WHEN :deadline_ms IS NULL THEN NULL ELSE :now + :deadline_ms * 1000 END, :now)"
    " ON CONFLICT (idem_key) DO NOTHING"
)
APPROVAL_GET: Final = (
    "SELECT " + _REQUEST_COLUMNS + " FROM agent_ledger_approvals WHERE idem_key = ?"
)
# overdue_approvals: deadlines passed by the store's clock, the oldest first.
# renew_request: a new request replaces the old (asker, policy, deadline from
# now; not escalated yet).
APPROVAL_RENEW: Final = (
    "INSERT INTO agent_ledger_approvals"
    " (idem_key, requested_by, policy_version, deadline_us, created_us)"
    " VALUES (:idem_key, :requested_by, :policy_version,"
    " CASE WHEN :deadline_ms IS NULL THEN NULL ELSE :now + :deadline_ms * 1000 END, :now)"
    " ON CONFLICT (idem_key) DO UPDATE SET requested_by = excluded.requested_by,"
    " policy_version = excluded.policy_version, deadline_us = excluded.deadline_us,"
    " escalated_us = NULL, created_us = excluded.created_us"
)
_A_REQUEST_COLUMNS: Final = (
    "a.idem_key, a.requested_by, a.policy_version, a.deadline_us, a.escalated_us, a.created_us"
)
# The requests whose effect still waits for an approval (not parked: an
# ambiguous attempt is never denied by a clock).
_WAITING_REQUESTS: Final = (
    " FROM agent_ledger_approvals AS a JOIN agent_ledger_effects AS e"
    " ON e.idem_key = a.idem_key WHERE e.status = :waiting"
    " AND e.error_code IS NOT :ambiguous AND a.deadline_us IS NOT NULL"
)
# overdue_approvals: deadlines passed by the store's clock, the oldest first.
APPROVALS_OVERDUE: Final = (
    "SELECT " + _A_REQUEST_COLUMNS + _WAITING_REQUESTS + " AND a.deadline_us <= :now"
    " ORDER BY a.deadline_us, a.idem_key LIMIT :limit"
)
# escalations_due: not escalated, deadline ahead, ``fraction`` of the wait used.
ESCALATIONS_DUE: Final = (
    "SELECT " + _A_REQUEST_COLUMNS + _WAITING_REQUESTS + " AND a.escalated_us IS NULL"
    " AND a.deadline_us > :now"
    " AND a.created_us + CAST((a.deadline_us - a.created_us) * :fraction AS INTEGER) <= :now"
    " ORDER BY a.deadline_us, a.idem_key LIMIT :limit"
)
# mark_escalated: once per request (its created_us names it).
ESCALATION_MARK: Final = (
    "UPDATE agent_ledger_approvals SET escalated_us = :now"
    " WHERE idem_key = :idem_key AND escalated_us IS NULL AND created_us = :created"
)
# decide: has this link already decided? (Read under the write lock, so the
# check and the insert below see no other writer in between.)
LINK_USED: Final = "SELECT 1 FROM agent_ledger_used_links WHERE nonce = ?"
LINK_INSERT: Final = (
    "INSERT INTO agent_ledger_used_links (nonce, idem_key, action, used_by, used_us, expires_us)"
    " VALUES (:nonce, :idem_key, :action, :used_by, :now, :expires)"
)
# record_attempt, and decide's accepted row: one row of the audit trail.
ATTEMPT_INSERT: Final = (
    "INSERT INTO agent_ledger_decision_attempts (idem_key, principal, channel, action,"
    " outcome, reason_code, intent_hash, note, at_us) VALUES (:a_idem_key, :a_principal,"
    " :a_channel, :a_action, :a_outcome, :a_reason, :a_intent, :a_note, :now)"
)
_ATTEMPT_COLUMNS: Final = (
    "id, idem_key, principal, channel, action, outcome, reason_code, intent_hash, note, at_us"
)
ATTEMPTS_OF: Final = (
    "SELECT " + _ATTEMPT_COLUMNS + " FROM agent_ledger_decision_attempts"
    " WHERE idem_key = :idem_key ORDER BY id LIMIT :limit"
)
ATTEMPTS_ALL: Final = (
    "SELECT " + _ATTEMPT_COLUMNS + " FROM agent_ledger_decision_attempts ORDER BY id LIMIT :limit"
)
