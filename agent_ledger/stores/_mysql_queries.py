"""Every SQL statement MySQLStore runs, one or a few per ledger step, in one place.

Statements are ``%(name)s`` parameter queries for the asyncmy driver, which
escapes every value on the client (a tuple becomes ``('a', 'b')``, for
``IN``); a literal ``%`` is written ``%%``. The steps every call makes run
instead as prepared statements, in the positional form ``Positional`` makes
of them (the ``*_PS`` below; see "the binary protocol"). Tables are unqualified: they
live in the connection's database. Statuses are parameters too (they come
from ``EffectStatus``, never retyped here).

Times come from the database's clock, ``UTC_TIMESTAMP(6)`` (microseconds,
UTC, fixed for the length of one statement), written to ``DATETIME(6)``
columns; staleness is judged against it too, never against a worker's clock.

Three things every reader of MySQL SQL must keep in mind, and the statements
below are written for:

* A locking statement (an ``UPDATE``, a ``FOR UPDATE``) waits for every row
  lock on the index entries it walks, matching rows or not. On a small table
  the optimizer may walk the (status, heartbeat) index for ``WHERE id = x AND
  status = 'processing'`` and then wait behind another transaction's
  uncommitted row that it was never going to change. Every single-row step
  therefore names its index: ``FORCE INDEX (PRIMARY)`` by id, the unique
  key's index by key.

* ``UPDATE ... SET a = ..., b = f(a)`` reads the *new* ``a`` in ``b`` (the
  assignments run left to right; PostgreSQL and SQLite read the old row).
  So an assignment that reads a column comes before the one that changes
  that column, and a comment says so where it matters.
* Neither MariaDB nor MySQL has ``UPDATE ... RETURNING``. A step that must
  give back the row it changed (claim, transition, reopen, park, settle)
  runs the update and a read of the row inside one transaction: the update's
  row lock keeps anyone else from changing the row until the read is done.
  MariaDB's ``INSERT ... RETURNING`` (10.5+) makes begin one statement; MySQL 8,
  without it, reads the row back after the insert (``MySQLStore`` picks the
  form once, at connect time).

Which server is in use is detected once at connect (``SELECT VERSION()``);
the statements that differ are the pairs named ``*_MARIADB`` / ``*_MYSQL``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from operator import itemgetter
from typing import Final

from agent_ledger.status import TERMINAL
from agent_ledger.stores._columns import select_list

# -- the binary protocol --
# asyncmy runs a statement given positional parameters (`%s`, a tuple) as a
# server-side prepared statement when its connection keeps a statement cache,
# as the store's connections do: prepared once per connection, then sent as
# the statement's id and the values in binary, its rows read back in binary
# (nothing escaped or quoted on the way out, no text parsed on the way back).
# The steps every call makes (begin, commit, the reads by key and id) use that
# form, made from their named statement below by `Positional`: the same SQL,
# with one `%s` per `%(name)s`, and one per value for a list of fixed values
# (an IN list of statuses), sent with the rest. A statement given a dict
# goes by the text protocol, its values escaped into the text on the client.
_NAMED: Final = re.compile(r"%\((\w+)\)s")


class Positional:
    """A ``%(name)s`` statement in the driver's positional form, and its parameters
    in that order (``args``): run as a server-side prepared statement."""

    __slots__ = ("_pick", "_plan", "_single", "_tail", "sql")

    def __init__(self, statement: str, **constants: tuple[object, ...]) -> None:
        """``constants``: parameters whose values are fixed (an IN list of
        statuses), sent as values in their place, one ``%s`` each."""
        names: list[str] = []
        plan: list[str | tuple[object, ...]] = []

        def placeholder(match: re.Match[str]) -> str:
            name = match.group(1)
            fixed = constants.get(name)
            if fixed is None:
                names.append(name)
                plan.append(name)
                return "%s"
            plan.append(fixed)
            return "(" + ", ".join(["%s"] * len(fixed)) + ")"

        #: The statement with ``%s`` placeholders (a literal ``%`` still ``%%``).
        self.sql: Final = _NAMED.sub(placeholder, statement)
        unused = set(constants) - set(_NAMED.findall(statement))
        if not names or unused or not all(constants.values()):
            raise ValueError(f"a statement with parameters and these constants: {constants}")
        self._single: Final = len(names) == 1
        self._plan: Final = tuple(plan)
        self._pick: Final = itemgetter(*names)
        # The usual case, constants only after every parameter: appended at once.
        first = next((i for i, step in enumerate(plan) if isinstance(step, tuple)), len(plan))
        tail = plan[first:]
        self._tail: Final = (
            tuple(value for step in tail for value in step)
            if all(isinstance(step, tuple) for step in tail)
            else None
        )

    def args(self, params: Mapping[str, object]) -> tuple[object, ...]:
        """The values of ``params`` (and the constants) in placeholder order."""
        values: tuple[object, ...] = (self._pick(params),) if self._single else self._pick(params)
        if self._tail is not None:
            return values + self._tail if self._tail else values
        spread: list[object] = []
        for step in self._plan:
            if isinstance(step, tuple):
                spread.extend(step)
            else:
                spread.append(params[step])
        return tuple(spread)


# How MySQL keeps the fields it does not keep as-is (see _columns): `usage` is
# a reserved word and must be quoted; everything else is a column of its own
# name (times DATETIME(6), the error as two columns, JSON as text).
_EXPRESSIONS: Final = {"usage": "`usage`"}
#: The columns every effect query returns, in the order ``effect_from_row`` reads them.
EFFECT_COLUMNS: Final = select_list(_EXPRESSIONS)
#: The database's clock: UTC, microseconds.
NOW: Final = "UTC_TIMESTAMP(6)"
# A time as the ISO 8601 text the history's events hold (what PostgreSQL's
# jsonb gives a timestamptz, exact to the µs).
_ISO: Final = "DATE_FORMAT({col}, '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00')"

# -- connecting --
# The server's kind and version: "10.11.6-MariaDB-..." or "8.0.36".
SERVER_VERSION: Final = "SELECT VERSION(), @@max_allowed_packet"
# Every connection the store opens reads committed rows afresh per statement
# and takes no gap locks on misses (REPEATABLE READ's next-key locks make
# concurrent inserts of new keys deadlock): the same model as PostgreSQL's
# default. Strict mode turns a value that does not fit (a name longer than
# its column) into an error instead of a silent truncation.
SESSION_ISOLATION: Final = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
SESSION_SQL_MODE: Final = "SET SESSION sql_mode = %(mode)s"
SQL_MODE: Final = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,ERROR_FOR_DIVISION_BY_ZERO"

# -- schema --
# Migrations take turns on a named lock (MySQL's DDL is not transactional).
SCHEMA_LOCK: Final = "SELECT GET_LOCK('agent_ledger_schema', %(timeout_s)s)"
SCHEMA_UNLOCK: Final = "SELECT RELEASE_LOCK('agent_ledger_schema')"
# Is there a version marker yet in the connection's database? (A new one: version 0.)
HAS_VERSIONS_TABLE: Final = (
    "SELECT COUNT(*) FROM information_schema.tables"
    " WHERE table_schema = DATABASE() AND table_name = 'agent_ledger_schema_version'"
)
SCHEMA_VERSION: Final = "SELECT MAX(version) FROM agent_ledger_schema_version"

# -- begin --
# Insert-or-read in one statement. A new key is inserted as processing (or,
# for a call that needs approval, straight into requires_approval: never
# claimable before a person decides), attempt 1, with its creator's lease and
# the id the store chose; the row comes back with that id, which is how the
# store tells "created" from "found" (the affected-rows count cannot: with
# CLIENT_FOUND_ROWS an unchanged duplicate counts 1 like an insert). An
# existing key takes the ON DUPLICATE KEY branch: a duplicate of an open
# effect (one a caller may wait for) counts at once, +1; a finished one adds
# 0 and is counted later, in a batch (DEDUP_FLUSH), so that a replay writes
# nothing. MariaDB returns the row as it now stands (RETURNING); MySQL 8 reads
# it back with FIND after the insert.
_INSERT: Final = (
    "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, call_id, tool, status,"
    " args_canonical, resource_id_canonical, lease_ms, executions, started_at, created_at,"
    " updated_at, heartbeat_at, history)"
    " VALUES (%(id)s, %(idem_key)s, %(workflow_id)s, %(call_id)s, %(tool)s, %(status)s,"
    " %(args_canonical)s, %(resource_id_canonical)s, %(lease_ms)s, %(executions)s,"
    " IF(%(executions)s > 0, "
    + NOW
    + ", NULL), "
    + NOW
    + ", "
    + NOW
    + ", "
    + NOW
    + ", %(history)s)"
    " ON DUPLICATE KEY UPDATE dedup_count = dedup_count + IF(status IN %(finished)s, 0, 1)"
)
#: The statuses whose duplicates begin counts later (TERMINAL's), for ``finished``.
FINISHED: Final = tuple(sorted(s.value for s in TERMINAL))
BEGIN_MARIADB: Final = _INSERT + " RETURNING " + EFFECT_COLUMNS
BEGIN_MYSQL: Final = _INSERT


@functools.cache
def begin_ps(mariadb: bool, lock_wait_s: int | None) -> Positional:
    """begin in the binary protocol (the statuses counted later: ``FINISHED``), on
    MariaDB bounded to wait at most ``lock_wait_s`` (whole seconds) for a row
    lock (``LOCK_BOUND_MARIADB``; None: the server's ``innodb_lock_wait_timeout``)."""
    if not mariadb:
        return Positional(BEGIN_MYSQL, finished=FINISHED)
    bound = "" if lock_wait_s is None else LOCK_BOUND_MARIADB.format(seconds=lock_wait_s)
    return Positional(bound + BEGIN_MARIADB, finished=FINISHED)


# -- begin, inside a caller's transaction --
# An existing key is only read (FIND), whatever its status: a write would lock
# its row until the caller's transaction ends, and the holder's heartbeats
# and commit would queue behind it (so nothing counts the duplicate here,
# as Store.begin says). A new key is inserted with INSERT_ONLY; if a
# concurrent insert of the key committed between the read and the insert,
# the insert fails as a duplicate and FIND_LOCKED reads the row, which the
# caller's snapshot may not show (a locking read sees the newest commit).
INSERT_ONLY_MARIADB: Final = (
    "INSERT INTO agent_ledger_effects (id, idem_key, workflow_id, call_id, tool, status,"
    " args_canonical, resource_id_canonical, lease_ms, executions, started_at, created_at,"
    " updated_at, heartbeat_at, history)"
    " VALUES (%(id)s, %(idem_key)s, %(workflow_id)s, %(call_id)s, %(tool)s, %(status)s,"
    " %(args_canonical)s, %(resource_id_canonical)s, %(lease_ms)s, %(executions)s,"
    " IF(%(executions)s > 0, "
    + NOW
    + ", NULL), "
    + NOW
    + ", "
    + NOW
    + ", "
    + NOW
    + ", %(history)s)"
    " RETURNING " + EFFECT_COLUMNS
)
INSERT_ONLY_MYSQL: Final = INSERT_ONLY_MARIADB.split(" RETURNING ", 1)[0]

# -- bounded lock waits, inside a caller's transaction --
# MariaDB sets the InnoDB lock wait for one statement only (SET STATEMENT ...
# FOR); MySQL 8 has no such form, so the store sets the session's value
# around the statement and puts the caller's back after. Either way the
# bound is in whole seconds (InnoDB counts no finer), and a statement whose
# wait runs out (error 1205) is rolled back alone: the caller's transaction
# stays usable.
LOCK_BOUND_MARIADB: Final = "SET STATEMENT innodb_lock_wait_timeout = {seconds:d} FOR "
LOCK_WAIT_READ: Final = "SELECT @@SESSION.innodb_lock_wait_timeout"
LOCK_WAIT_SET: Final = "SET SESSION innodb_lock_wait_timeout = {seconds:d}"

# -- claim --
# Take the effect from any status in `claimable` (status.CLAIMABLE: ready, and
# processing itself), but from processing only when its heartbeat is older
# than the holder's lease, and than the caller's stale_ms, by the database
# clock: a takeover (0 on either side: never), and never of an attempt whose
# handler started under on_stale="park" (PARK takes those; `<=>` is
# null-safe equality). +1 attempt fences the previous holder; the caller's
# lease_ms becomes the new holder's lease. Concurrent claims serialize on the
# row lock and re-check the WHERE, so one wins. FIND_LOCKED then reads the
# row in the same transaction.
CLAIM: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (agent_ledger_effects_idem_key_idx)"
    " SET status = %(processing)s, attempt = attempt + 1,"
    " executions = executions + 1, lease_ms = %(lease_ms)s,"
    " heartbeat_at = " + NOW + ", started_at = " + NOW + ", updated_at = " + NOW + ""
    " WHERE idem_key = %(idem_key)s AND status IN %(claimable)s"
    " AND (status <> %(processing)s OR (%(stale_ms)s > 0 AND lease_ms > 0"
    " AND heartbeat_at <= "
    + NOW
    + " - INTERVAL GREATEST(lease_ms, %(stale_ms)s) * 1000 MICROSECOND"
    " AND NOT (park_attempt <=> attempt)))"
)

# -- heartbeat --
# One transaction for every effect a ledger runs. HEARTBEAT_FREE locks the
# rows still held (processing; the store matches the attempts) that no other
# transaction has locked: SKIP LOCKED, so one locked row cannot hold up the
# whole batch. HEARTBEAT_BEAT refreshes those. Only when some pair did not
# come back does HEARTBEAT_HELD read which of them are still held as last
# committed (busy: send again next time); the rest are no longer held.
HEARTBEAT_FREE: Final = (
    "SELECT id, attempt FROM agent_ledger_effects FORCE INDEX (PRIMARY) WHERE id IN %(ids)s"
    " AND status = %(processing)s FOR UPDATE SKIP LOCKED"
)
HEARTBEAT_BEAT: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (PRIMARY) SET heartbeat_at = "
    + NOW
    + " WHERE id IN %(ids)s"
)
HEARTBEAT_HELD: Final = (
    "SELECT id, attempt FROM agent_ledger_effects WHERE id IN %(ids)s AND status = %(processing)s"
)

# -- commit --
# Compare-and-set processing -> succeeded/failed/canceled on (id, status,
# attempt): the first commit wins, and a late commit from an older attempt
# matches no row. A NULL attempt skips the fencing check (unfenced commit()).
# One statement, in autocommit: the whole durable step.
COMMIT: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (PRIMARY)"
    " SET status = %(status)s, result = %(result)s,"
    " `usage` = %(usage)s, error_message = %(error_message)s, error_code = %(error_code)s,"
    " tries = tries + %(tried)s, executions = executions - %(unstarted)s,"
    " completed_at = " + NOW + ", updated_at = " + NOW + ","
    " history = IF(%(retryable)s, JSON_ARRAY_APPEND(history, '$', JSON_OBJECT('kind',"
    " %(retryable_kind)s, 'attempt', attempt, 'message', %(error_message)s, 'code',"
    " %(error_code)s, 'at', " + _ISO.format(col=NOW) + ")), history)"
    " WHERE id = %(id)s AND status = %(processing)s"
    " AND (%(attempt)s IS NULL OR attempt = %(attempt)s)"
)
COMMIT_PS: Final = Positional(COMMIT)
# The key of an effect, to wake this process's waiters on it.
KEY_OF: Final = "SELECT idem_key FROM agent_ledger_effects WHERE id = %(id)s"
KEY_OF_PS: Final = Positional(KEY_OF)

# -- record_try --
# One failed try of a retried handler, fenced like a commit on (id, status,
# attempt) but leaving the status as it is: +1 try, and the try's failure
# (`event`, JSON text from _params) appended to the history with its number
# and the database's time. The history is assigned first, so `tries + 1`
# there reads the old count (see the module doc). The holder is alive: its
# heartbeat too.
RECORD_TRY: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (PRIMARY) SET"
    " history = JSON_ARRAY_APPEND(history, '$', JSON_MERGE_PATCH(%(event)s,"
    " JSON_OBJECT('try', tries + 1, 'at', " + _ISO.format(col=NOW) + "))),"
    " tries = tries + 1, heartbeat_at = " + NOW + ""
    " WHERE id = %(id)s AND status = %(processing)s AND attempt = %(attempt)s"
)
RECORD_TRY_PS: Final = Positional(RECORD_TRY)

# -- release --
# Compare-and-set processing -> ready on (id, status, attempt): the holder gives
# the effect back before its handler started, so the claim's execution is taken
# back; started_at (assigned before executions changes) is cleared when none is
# left. Heartbeat and lease stay.
RELEASE: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (PRIMARY) SET"
    " started_at = IF(executions = 1, NULL, started_at),"
    " executions = executions - 1, status = %(ready)s, updated_at = " + NOW + ""
    " WHERE id = %(id)s AND status = %(processing)s AND attempt = %(attempt)s"
)
RELEASE_PS: Final = Positional(RELEASE)

# -- transition --
# Compare-and-set by key from any allowed source status (request_approval,
# approve, deny, cancel). The error (a decision's reason) is kept when given,
# and so is who decided; completed_at is set when the target is terminal.
TRANSITION: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (agent_ledger_effects_idem_key_idx)"
    " SET status = %(target)s, updated_at = " + NOW + ","
    " error_message = IF(%(has_error)s, %(error_message)s, error_message),"
    " error_code = IF(%(has_error)s, %(error_code)s, error_code),"
    " decided_by = IF(%(decided)s, %(decided_by)s, decided_by),"
    " decision_note = IF(%(decided)s, %(decision_note)s, decision_note),"
    " decided_at = IF(%(decided)s, " + NOW + ", decided_at),"
    " completed_at = IF(%(terminal)s, " + NOW + ", completed_at)"
    " WHERE idem_key = %(idem_key)s AND status IN %(sources)s"
)

# -- reopen --
# Compare-and-set by key from failed or canceled (`sources`) to ready. How the
# effect had ended (status, error, tries) goes to the history first, while
# the row still holds it; then the error and completion are cleared, the
# tries start again, and the reopening is the latest decision. The attempt
# stays: the next claim moves it on.
REOPEN: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (agent_ledger_effects_idem_key_idx) SET"
    " history = JSON_ARRAY_APPEND(history, '$', JSON_OBJECT('kind', %(kind)s, 'status', status,"
    " 'error', IF(error_message IS NULL, NULL,"
    " JSON_OBJECT('message', error_message, 'code', error_code)),"
    " 'tries', tries, 'by', %(by)s, 'reason', %(reason)s, 'at', " + _ISO.format(col=NOW) + ")),"
    " status = %(ready)s, error_message = NULL, error_code = NULL, tries = 0,"
    " completed_at = NULL, decided_by = %(by)s, decision_note = %(reason)s,"
    " decided_at = " + NOW + ", updated_at = " + NOW + ""
    " WHERE idem_key = %(idem_key)s AND status IN %(sources)s"
)

# -- retry_failed --
# Compare-and-set failed -> processing at exactly `attempt` (the failure the
# caller read), for a later call after a retryable failure: concurrent callers
# serialize on the row lock and re-check the WHERE, so exactly one changes the
# row. Like a claim: attempt + 1 (assigned last: the WHERE already read the
# old one), one more execution, the caller's lease, heartbeat and start now;
# like a reopen: the outcome cleared and the tries counted afresh. The
# history keeps the failure. FIND then reads the effect as it stands.
RETRY_FAILED: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (agent_ledger_effects_idem_key_idx)"
    " SET status = %(processing)s, executions = executions + 1, lease_ms = %(lease_ms)s,"
    " result = NULL, `usage` = NULL, error_message = NULL, error_code = NULL, tries = 0,"
    " completed_at = NULL, heartbeat_at = " + NOW + ", started_at = " + NOW + ","
    " updated_at = " + NOW + ", attempt = attempt + 1"
    " WHERE idem_key = %(idem_key)s AND status = %(failed)s AND attempt = %(attempt)s"
)

# -- ambiguous attempts --
# mark_started: a run under on_stale="park" records, fenced by its attempt,
# that its handler starts now, and who runs it. A sign of life too.
MARK_STARTED: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (PRIMARY)"
    " SET park_attempt = attempt, worker = %(worker)s,"
    " heartbeat_at = " + NOW + ""
    " WHERE id = %(id)s AND status = %(processing)s AND attempt = %(attempt)s"
)
MARK_STARTED_PS: Final = Positional(MARK_STARTED)
# park: processing -> requires_approval, only for the attempt whose handler
# was recorded as started under park, and only once its holder has been
# silent for the longer of its lease and stale_ms (0 on either side: never),
# as a takeover would judge it. Concurrent parks and claims serialize on the
# row lock and re-check the WHERE, so one wins. The history (assigned first:
# it reads the attempt, start, worker and last heartbeat) keeps what a person
# needs to settle it; the reason goes to the error. The attempt stays.
PARK: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (agent_ledger_effects_idem_key_idx) SET"
    " history = JSON_ARRAY_APPEND(history, '$', JSON_OBJECT('kind', %(kind)s,"
    " 'attempt', attempt, 'started_at', IF(started_at IS NULL, NULL, "
    + _ISO.format(col="started_at")
    + "), 'worker', worker, 'heartbeat_at', "
    + _ISO.format(col="heartbeat_at")
    + ", 'at', "
    + _ISO.format(col=NOW)
    + ")),"
    " status = %(requires_approval)s, error_message = %(error_message)s,"
    " error_code = %(error_code)s, updated_at = " + NOW + ""
    " WHERE idem_key = %(idem_key)s AND status = %(processing)s AND park_attempt = attempt"
    " AND %(stale_ms)s > 0 AND lease_ms > 0"
    " AND heartbeat_at <= "
    + NOW
    + " - INTERVAL GREATEST(lease_ms, %(stale_ms)s) * 1000 MICROSECOND"
)
# settle: a person's approve, deny or resolve, requires_approval -> target, at
# the attempt they saw (expected_attempt; NULL: any) and, for resolve, only a
# parked effect. `tries` is assigned before the error changes (it reads the
# park's code); the error and result become what the decision says; the
# history keeps who, the attempt, the note and when.
SETTLE: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (agent_ledger_effects_idem_key_idx) SET"
    " tries = IF(%(fresh_tries)s AND error_code <=> %(ambiguous)s, 0, tries),"
    " history = JSON_ARRAY_APPEND(history, '$', JSON_OBJECT('kind', %(kind)s,"
    " 'status', %(target)s, 'attempt', attempt, 'by', %(decided_by)s,"
    " 'note', %(decision_note)s, 'at', " + _ISO.format(col=NOW) + ")),"
    " status = %(target)s, result = %(result)s,"
    " error_message = %(error_message)s, error_code = %(error_code)s,"
    " decided_by = %(decided_by)s, decision_note = %(decision_note)s, decided_at = " + NOW + ","
    " completed_at = IF(%(terminal)s, " + NOW + ", completed_at), updated_at = " + NOW + ""
    " WHERE idem_key = %(idem_key)s AND status = %(requires_approval)s"
    " AND (%(expected_attempt)s IS NULL OR attempt = %(expected_attempt)s)"
    " AND (NOT %(only_parked)s OR error_code <=> %(ambiguous)s)"
    # Past the request's deadline, by this database's clock, only a denial.
    " AND (%(ignores_deadline)s OR NOT EXISTS (SELECT 1 FROM agent_ledger_approvals AS a"
    " WHERE a.idem_key = agent_ledger_effects.idem_key AND a.deadline_at <= " + NOW + "))"
)

# -- get / find --
GET: Final = "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects WHERE id = %(id)s"
GET_PS: Final = Positional(GET)
FIND: Final = (
    "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects WHERE idem_key = %(idem_key)s"
)
FIND_PS: Final = Positional(FIND)
# The newest committed row even inside a caller's older snapshot (a locking
# read; the lock is held until that transaction ends, so only used after a
# lost insert race).
FIND_LOCKED: Final = FIND + " LOCK IN SHARE MODE"

# -- find_legacy / record_legacy --
# The effect a 0.2.x key was imported as: two primary-key reads in one
# statement. A mapping whose effect was purged finds nothing.
FIND_LEGACY: Final = (
    "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects WHERE idem_key = "
    "(SELECT idem_key FROM agent_ledger_legacy_keys WHERE legacy_key = %(legacy_key)s)"
)
# The first mapping of a 0.2.x key stays: a second insert fails as a
# duplicate (error 1062), which the store reads as "already mapped". Not
# INSERT IGNORE: that would also turn a too-long value into a truncated one.
RECORD_LEGACY: Final = (
    "INSERT INTO agent_ledger_legacy_keys (legacy_key, idem_key)"
    " VALUES (%(legacy_key)s, %(idem_key)s)"
)

# -- duplicate counts --
# One transaction for every effect this store counted duplicates of since
# the last flush. DEDUP_LOCK locks the rows (by effect id, not key: a key
# purged and used again by a new effect must not get the old one's counts)
# that no other transaction holds, SKIP LOCKED: a flush neither queues behind
# a caller's open transaction nor deadlocks with another process's flush.
# DEDUP_ADD then adds one increment to the rows of the ids given (one
# statement per distinct increment), and DEDUP_COUNTS (a plain read) names
# the skipped ids that still exist, kept for the next flush.
DEDUP_LOCK: Final = (
    "SELECT id FROM agent_ledger_effects FORCE INDEX (PRIMARY) WHERE id IN %(ids)s"
    " FOR UPDATE SKIP LOCKED"
)
DEDUP_ADD: Final = (
    "UPDATE agent_ledger_effects FORCE INDEX (PRIMARY)"
    " SET dedup_count = dedup_count + %(n)s WHERE id IN %(ids)s"
)
DEDUP_COUNTS: Final = "SELECT id, dedup_count FROM agent_ledger_effects WHERE id IN %(ids)s"

# -- list_effects --
# The audit trail, newest first. Only the filters the caller gave are joined
# into the WHERE clause (fragments below, never caller text), so each
# combination can use its index; `before` is the keyset position.
LIST: Final = "SELECT " + EFFECT_COLUMNS + " FROM agent_ledger_effects"
# Handler time in µs (effects.handler_time, which says why): from the run's
# start to its recorded end, or to now while it runs; NULL (never matching)
# when no run's end is known.
HANDLER_TIME: Final = (
    "(CASE WHEN started_at IS NULL OR decided_at > started_at THEN NULL"
    " WHEN status = %(processing)s THEN TIMESTAMPDIFF(MICROSECOND, started_at, " + NOW + ")"
    " WHEN status IN %(run_ends)s THEN TIMESTAMPDIFF(MICROSECOND, started_at, completed_at) END)"
)
LIST_FILTERS: Final = {
    "workflow_id": "workflow_id = %(workflow_id)s",
    "tool": "tool = %(tool)s",
    "status": "status = %(status)s",
    "since": "created_at >= %(since)s",
    "until": "created_at < %(until)s",
    "before": "(created_at < %(before_at)s OR (created_at = %(before_at)s AND id < %(before_id)s))",
    # A range rather than LIKE, so the unique index on idem_key serves it:
    # keys are lowercase hex and 'g' sorts after 'f' (binary collation).
    "idem_key_prefix": (
        "idem_key >= %(idem_key_prefix)s AND idem_key < CONCAT(%(idem_key_prefix)s, 'g')"
    ),
    "call_id": "call_id = %(call_id)s",
    "error_code": "error_code = %(error_code)s",
    "min_duration": HANDLER_TIME + " >= %(min_duration_us)s",
    "max_duration": HANDLER_TIME + " <= %(max_duration_us)s",
}
LIST_ORDER: Final = " ORDER BY created_at DESC, id DESC LIMIT %(limit)s"

# -- stats --
# One pass over the table: counts and duplicates per (status, tool).
STATS: Final = (
    "SELECT status, tool, COUNT(*), COALESCE(SUM(dedup_count), 0)"
    " FROM agent_ledger_effects GROUP BY status, tool"
)

# -- purge --
# Retention: terminal effects (the caller passes only terminal statuses)
# completed at least older_us ago by the database clock.
PURGE: Final = (
    "DELETE FROM agent_ledger_effects WHERE status IN %(statuses)s"
    " AND completed_at <= " + NOW + " - INTERVAL %(older_us)s MICROSECOND"
    # A saga's step or undo stays: without it `sagas show` would list the
    # saga's steps as never run (sagas themselves are never purged).
    " AND NOT EXISTS (SELECT 1 FROM agent_ledger_saga_steps s"
    " WHERE s.idem_key = agent_ledger_effects.idem_key"
    " OR s.compensation_key = agent_ledger_effects.idem_key)"
)

# -- sagas (see stores/saga_base.py) --
# A saga is a row with a fenced owner, as an effect is; each writing step
# is one statement, or a few in one transaction (record_step).
SAGA_COLUMNS: Final = (
    "saga_id, status, attempt, owner, lease_ms, heartbeat_at, abandon_after_ms,"
    " on_compensation_failure, error_message, error_code, created_at, updated_at, completed_at"
)
STEP_COLUMNS: Final = (
    "saga_id, position, group_index, tool, idem_key, compensation, compensation_key,"
    " compensate_if, created_at"
)
# A new id is inserted running at attempt 1; an existing one fails as a
# duplicate (1062), and SAGA_GET reads it either way.
SAGA_INSERT: Final = (
    "INSERT INTO agent_ledger_sagas (saga_id, status, owner, lease_ms, heartbeat_at,"
    " abandon_after_ms, on_compensation_failure, created_at, updated_at)"
    " VALUES (%(saga_id)s, %(status)s, %(owner)s, %(lease_ms)s, " + NOW + ","
    " %(abandon_after_ms)s, %(on_compensation_failure)s, " + NOW + ", " + NOW + ")"
)
SAGA_GET: Final = "SELECT " + SAGA_COLUMNS + " FROM agent_ledger_sagas WHERE saga_id = %(saga_id)s"
# A takeover, as CLAIM is for effects: from `expect`, only when the heartbeat
# is older than both the holder's lease and idle_ms (a lease of 0 is never
# taken over). Concurrent claims serialize on the row lock and re-check the
# WHERE, so one wins; +1 attempt fences the old owner out of every later step.
SAGA_CLAIM: Final = (
    "UPDATE agent_ledger_sagas FORCE INDEX (PRIMARY)"
    " SET status = %(then)s, attempt = attempt + 1, owner = %(owner)s,"
    " lease_ms = %(lease_ms)s, heartbeat_at = " + NOW + ", updated_at = " + NOW + ""
    " WHERE saga_id = %(saga_id)s AND status = %(expect)s AND lease_ms > 0"
    " AND heartbeat_at <= " + NOW + " - INTERVAL GREATEST(lease_ms, %(idle_ms)s) * 1000 MICROSECOND"
)
SAGA_HEARTBEAT: Final = (
    "UPDATE agent_ledger_sagas FORCE INDEX (PRIMARY) SET heartbeat_at = " + NOW + ""
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status IN %(open)s"
)
SAGA_RELEASE: Final = (
    "UPDATE agent_ledger_sagas FORCE INDEX (PRIMARY) SET heartbeat_at = '1970-01-01'"
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status = %(compensating)s"
)
# The owner's own move, fenced by its attempt; an error given replaces the stored one.
SAGA_FINISH: Final = (
    "UPDATE agent_ledger_sagas FORCE INDEX (PRIMARY) SET status = %(then)s, heartbeat_at = "
    + NOW
    + ","
    " updated_at = " + NOW + ","
    " error_message = IF(%(has_error)s, %(error_message)s, error_message),"
    " error_code = IF(%(has_error)s, %(error_code)s, error_code),"
    " completed_at = IF(%(terminal)s, " + NOW + ", NULL)"
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status = %(expect)s"
)
# Is the caller still the owner of the running saga? A locking read (shared):
# the saga row stays locked until record_step's transaction ends, so a claim
# (an UPDATE of that row) waits for it; a takeover that then reads the steps
# sees this one, and an insert after the takeover finds the attempt changed.
SAGA_OWNS_RUNNING: Final = (
    "SELECT 1 FROM agent_ledger_sagas"
    " WHERE saga_id = %(saga_id)s AND attempt = %(attempt)s AND status = %(running)s"
    " LOCK IN SHARE MODE"
)
# A position already recorded fails as a duplicate (1062); STEP_GET reads it.
STEP_INSERT: Final = (
    "INSERT INTO agent_ledger_saga_steps (saga_id, position, group_index, tool, idem_key,"
    " compensation, compensation_key, compensate_if, created_at)"
    " VALUES (%(saga_id)s, %(position)s, %(group_index)s, %(tool)s, %(idem_key)s,"
    " %(compensation)s, %(compensation_key)s, %(compensate_if)s, " + NOW + ")"
)
STEP_GET: Final = (
    "SELECT " + STEP_COLUMNS + " FROM agent_ledger_saga_steps"
    " WHERE saga_id = %(saga_id)s AND position = %(position)s"
)
SAGA_STEPS: Final = (
    "SELECT " + STEP_COLUMNS + " FROM agent_ledger_saga_steps WHERE saga_id = %(saga_id)s"
    " ORDER BY position"
)
SAGA_LIST_ALL: Final = (
    "SELECT " + SAGA_COLUMNS + " FROM agent_ledger_sagas"
    " ORDER BY created_at DESC, saga_id DESC LIMIT %(limit)s"
)
SAGA_LIST: Final = (
    "SELECT " + SAGA_COLUMNS + " FROM agent_ledger_sagas WHERE status IN %(statuses)s"
    " ORDER BY created_at DESC, saga_id DESC LIMIT %(limit)s"
)
# What a recoverer's SAGA_CLAIM would take now, oldest first, after a cursor.
SAGA_CLAIMABLE: Final = (
    "SELECT " + SAGA_COLUMNS + " FROM agent_ledger_sagas WHERE lease_ms > 0"
    " AND status IN ('running', 'compensating')"
    " AND ((status = 'compensating'"
    " AND heartbeat_at <= " + NOW + " - INTERVAL lease_ms * 1000 MICROSECOND)"
    " OR (status = 'running' AND abandon_after_ms IS NOT NULL"
    " AND heartbeat_at <= "
    + NOW
    + " - INTERVAL GREATEST(lease_ms, abandon_after_ms) * 1000 MICROSECOND))"
    " AND (%(after_at)s IS NULL OR created_at > %(after_at)s"
    " OR (created_at = %(after_at)s AND saga_id > %(after_id)s))"
    " ORDER BY created_at, saga_id LIMIT %(limit)s"
)

# -- budgets (see stores/budget_base.py) --
# Every budget step that changes holds or the budget row is one transaction
# that first locks the budget row (BUDGET_LOCK, which also reads the
# database's clock once for the whole step); the steps of one budget then run
# one after another and each sees all the holds, and the room each effect
# takes is worked out in Python (_mysql_budgets), as SqliteStore does under
# its write lock. Amounts are BIGINTs in each unit (dollars in millionths).
BUDGET_COLUMNS: Final = (
    "b.workflow_id, b.limit_usd_micros, b.limit_input_tokens, b.limit_output_tokens,"
    " b.limit_tool_calls, b.spent_usd_micros, b.spent_input_tokens, b.spent_output_tokens,"
    " b.spent_tool_calls, b.reserved_usd_micros, b.reserved_input_tokens,"
    " b.reserved_output_tokens, b.reserved_tool_calls,"
    " (SELECT COUNT(DISTINCT h.idem_key) FROM agent_ledger_budget_holds AS h"
    " WHERE h.workflow_id = b.workflow_id),"
    " b.created_at, b.updated_at"
)
# A new budget; an existing one fails as a duplicate (1062) and BUDGET_GET reads it.
BUDGET_INSERT: Final = (
    "INSERT INTO agent_ledger_budgets (workflow_id, limit_usd_micros, limit_input_tokens,"
    " limit_output_tokens, limit_tool_calls, created_at, updated_at)"
    " VALUES (%(workflow_id)s, %(limit_usd_micros)s, %(limit_input_tokens)s,"
    " %(limit_output_tokens)s, %(limit_tool_calls)s, " + NOW + ", " + NOW + ")"
)
BUDGET_GET: Final = (
    "SELECT " + BUDGET_COLUMNS + " FROM agent_ledger_budgets AS b"
    " WHERE b.workflow_id = %(workflow_id)s"
)
BUDGET_LOCK: Final = (
    "SELECT workflow_id, " + NOW + " FROM agent_ledger_budgets"
    " WHERE workflow_id = %(workflow_id)s FOR UPDATE"
)
BUDGET_LIST: Final = (
    "SELECT " + BUDGET_COLUMNS + " FROM agent_ledger_budgets AS b"
    " ORDER BY b.updated_at DESC, b.workflow_id DESC LIMIT %(limit)s"
)
HOLD_INSERT: Final = (
    "INSERT INTO agent_ledger_budget_holds (hold_id, workflow_id, idem_key, usd_micros,"
    " input_tokens, output_tokens, tool_calls, created_at, expires_at)"
    " VALUES (%(hold_id)s, %(workflow_id)s, %(idem_key)s, %(add_usd_micros)s,"
    " %(add_input_tokens)s, %(add_output_tokens)s, %(add_tool_calls)s, %(now)s,"
    " %(now)s + INTERVAL %(ttl_ms)s * 1000 MICROSECOND)"
)
# The holds a step gives back (their effects' rooms worked out in Python),
# and the holds of one effect. Completed with one of the conditions below.
HOLD_ROWS: Final = (
    "SELECT hold_id, idem_key, usd_micros, input_tokens, output_tokens, tool_calls, expires_at"
    " FROM agent_ledger_budget_holds WHERE workflow_id = %(workflow_id)s AND "
)
# A booking's holds: the caller's, and the effect's made strictly before the
# booked run finished (finished_at; NULL: none), so a rerun's hold made after
# a reopen keeps its room.
OF_EFFECT: Final = (
    "(hold_id = %(hold_id)s OR (idem_key = %(idem_key)s AND created_at < %(finished_at)s))"
)
OF_KEY: Final = "idem_key = %(idem_key)s"
ONE_HOLD: Final = "hold_id = %(hold_id)s"
EXPIRED: Final = "expires_at <= %(now)s"
# Detaching a hold: into a room of its own (stores/budget_base.py, detach_hold).
HOLD_REKEY: Final = (
    "UPDATE agent_ledger_budget_holds SET idem_key = %(new_key)s"
    " WHERE workflow_id = %(workflow_id)s AND hold_id = %(hold_id)s"
)
DELETE_HOLD_ONE: Final = (
    "DELETE FROM agent_ledger_budget_holds"
    " WHERE workflow_id = %(workflow_id)s AND hold_id = %(hold_id)s"
)
# A charge, one row per (budget, idem key): what was booked for that effect.
# A later booking raises it to the larger receipt, unit by unit (CHARGE_RAISE),
# and the budget's spent grows by the difference.
CHARGE_GET: Final = (
    "SELECT usd_micros, input_tokens, output_tokens, tool_calls"
    " FROM agent_ledger_budget_charges"
    " WHERE workflow_id = %(workflow_id)s AND idem_key = %(idem_key)s FOR UPDATE"
)
CHARGE_RAISE: Final = (
    "UPDATE agent_ledger_budget_charges SET usd_micros = %(add_usd_micros)s,"
    " input_tokens = %(add_input_tokens)s, output_tokens = %(add_output_tokens)s,"
    " tool_calls = %(add_tool_calls)s, booked_at = %(now)s"
    " WHERE workflow_id = %(workflow_id)s AND idem_key = %(idem_key)s"
)
CHARGE_INSERT: Final = (
    "INSERT INTO agent_ledger_budget_charges (workflow_id, idem_key, usd_micros, input_tokens,"
    " output_tokens, tool_calls, booked_at)"
    " VALUES (%(workflow_id)s, %(idem_key)s, %(add_usd_micros)s, %(add_input_tokens)s,"
    " %(add_output_tokens)s, %(add_tool_calls)s, %(now)s)"
)
# What was booked (spent_*, zero when nothing was) and given back (freed_*).
BUDGET_APPLY: Final = (
    "UPDATE agent_ledger_budgets SET"
    " spent_usd_micros = spent_usd_micros + %(spent_usd_micros)s,"
    " spent_input_tokens = spent_input_tokens + %(spent_input_tokens)s,"
    " spent_output_tokens = spent_output_tokens + %(spent_output_tokens)s,"
    " spent_tool_calls = spent_tool_calls + %(spent_tool_calls)s,"
    " reserved_usd_micros = reserved_usd_micros - %(freed_usd_micros)s,"
    " reserved_input_tokens = reserved_input_tokens - %(freed_input_tokens)s,"
    " reserved_output_tokens = reserved_output_tokens - %(freed_output_tokens)s,"
    " reserved_tool_calls = reserved_tool_calls - %(freed_tool_calls)s, updated_at = %(now)s"
    " WHERE workflow_id = %(workflow_id)s"
)

# -- approvals (schema version 4; see stores/approval_base.py) --
_REQUEST_COLUMNS: Final = (
    "idem_key, requested_by, policy_version, deadline_at, escalated_at, created_at"
)
# note_request: insert-or-get; the first request's asker and deadline stand
# (a second insert is a duplicate key, and the row is read back as it is).
APPROVAL_INSERT: Final = (
    "INSERT INTO agent_ledger_approvals"
    " (idem_key, requested_by, policy_version, deadline_at, created_at)"
    " VALUES (%(idem_key)s, %(requested_by)s, %(policy_version)s,"
    " IF(%(deadline_ms)s IS NULL, NULL,"
    " UTC_TIMESTAMP(6) + INTERVAL %(deadline_ms)s * 1000 MICROSECOND), UTC_TIMESTAMP(6))"
)
APPROVAL_GET: Final = (
    "SELECT " + _REQUEST_COLUMNS + " FROM agent_ledger_approvals WHERE idem_key = %(idem_key)s"
)
# renew_request: a new request replaces the old (asker, policy, deadline from
# now; not escalated yet).
APPROVAL_RENEW: Final = (
    "INSERT INTO agent_ledger_approvals"
    " (idem_key, requested_by, policy_version, deadline_at, created_at)"
    " VALUES (%(idem_key)s, %(requested_by)s, %(policy_version)s,"
    " IF(%(deadline_ms)s IS NULL, NULL,"
    " UTC_TIMESTAMP(6) + INTERVAL %(deadline_ms)s * 1000 MICROSECOND), UTC_TIMESTAMP(6))"
    " ON DUPLICATE KEY UPDATE requested_by = VALUES(requested_by),"
    " policy_version = VALUES(policy_version), deadline_at = VALUES(deadline_at),"
    " escalated_at = NULL, created_at = VALUES(created_at)"
)
_A_REQUEST_COLUMNS: Final = (
    "a.idem_key, a.requested_by, a.policy_version, a.deadline_at, a.escalated_at, a.created_at"
)
# The requests whose effect still waits for an approval (not parked: an
# ambiguous attempt is never denied by a clock).
_WAITING_REQUESTS: Final = (
    " FROM agent_ledger_approvals AS a JOIN agent_ledger_effects AS e"
    " ON e.idem_key = a.idem_key WHERE e.status = %(waiting)s"
    " AND NOT (e.error_code <=> %(ambiguous)s) AND a.deadline_at IS NOT NULL"
)
APPROVALS_OVERDUE: Final = (
    "SELECT " + _A_REQUEST_COLUMNS + _WAITING_REQUESTS + " AND a.deadline_at <= UTC_TIMESTAMP(6)"
    " ORDER BY a.deadline_at, a.idem_key LIMIT %(limit)s"
)
# escalations_due: not escalated, deadline ahead, ``fraction`` of the wait used.
ESCALATIONS_DUE: Final = (
    "SELECT " + _A_REQUEST_COLUMNS + _WAITING_REQUESTS + " AND a.escalated_at IS NULL"
    " AND a.deadline_at > UTC_TIMESTAMP(6)"
    " AND a.created_at + INTERVAL FLOOR(TIMESTAMPDIFF(MICROSECOND, a.created_at,"
    " a.deadline_at) * %(fraction)s) MICROSECOND <= UTC_TIMESTAMP(6)"
    " ORDER BY a.deadline_at, a.idem_key LIMIT %(limit)s"
)
# mark_escalated: once per request (its created_at names it).
ESCALATION_MARK: Final = (
    "UPDATE agent_ledger_approvals SET escalated_at = UTC_TIMESTAMP(6)"
    " WHERE idem_key = %(idem_key)s AND escalated_at IS NULL AND created_at = %(created_at)s"
)
# decide: the nonce's insert comes first; the primary key says whether this
# link already decided (or a concurrent use of it holds the key: this one waits,
# then finds it used). A settle that then applies to nothing rolls it back.
LINK_INSERT: Final = (
    "INSERT INTO agent_ledger_used_links (nonce, idem_key, action, used_by, used_at, expires_at)"
    " VALUES (%(nonce)s, %(idem_key)s, %(action)s, %(used_by)s, UTC_TIMESTAMP(6), %(expires)s)"
)
ROLLBACK: Final = "ROLLBACK"
ATTEMPT_INSERT: Final = (
    "INSERT INTO agent_ledger_decision_attempts (idem_key, principal, channel, action,"
    " outcome, reason_code, intent_hash, note, at) VALUES (%(a_idem_key)s, %(a_principal)s,"
    " %(a_channel)s, %(a_action)s, %(a_outcome)s, %(a_reason)s, %(a_intent)s, %(a_note)s,"
    " UTC_TIMESTAMP(6))"
)
_ATTEMPT_COLUMNS: Final = (
    "id, idem_key, principal, channel, action, outcome, reason_code, intent_hash, note, at"
)
ATTEMPTS_OF: Final = (
    "SELECT " + _ATTEMPT_COLUMNS + " FROM agent_ledger_decision_attempts"
    " WHERE idem_key = %(idem_key)s ORDER BY id LIMIT %(limit)s"
)
ATTEMPTS_ALL: Final = (
    "SELECT " + _ATTEMPT_COLUMNS + " FROM agent_ledger_decision_attempts"
    " ORDER BY id LIMIT %(limit)s"
)
