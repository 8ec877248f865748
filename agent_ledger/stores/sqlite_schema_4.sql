-- agent-ledger SQLite schema, version 4, applied once on top of version 3.
--
-- Approvals for people: each request's asker, policy version and deadline;
-- every decision attempt (the audit trail); the signed links already used.
-- SqliteStore runs it under the write lock, and only when the file's
-- version is 3. What each column means: see the version 4 section of the
-- PostgreSQL schema (postgres_schema.sql). Times are integer microseconds.

CREATE TABLE agent_ledger_approvals (
    idem_key        TEXT    PRIMARY KEY,
    requested_by    TEXT,
    policy_version  TEXT,
    deadline_us     INTEGER,
    escalated_us    INTEGER,
    created_us      INTEGER NOT NULL
);
CREATE INDEX agent_ledger_approvals_deadline_idx
    ON agent_ledger_approvals (deadline_us) WHERE deadline_us IS NOT NULL;

CREATE TABLE agent_ledger_decision_attempts (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    idem_key     TEXT    NOT NULL,
    principal    TEXT    NOT NULL,
    channel      TEXT    NOT NULL
        CONSTRAINT agent_ledger_decision_attempts_channel_check CHECK (channel IN (
            'console', 'link', 'slack', 'cli', 'code')),
    action       TEXT    NOT NULL
        CONSTRAINT agent_ledger_decision_attempts_action_check CHECK (action IN (
            'approve', 'deny', 'resolve')),
    outcome      TEXT    NOT NULL
        CONSTRAINT agent_ledger_decision_attempts_outcome_check CHECK (outcome IN (
            'accepted', 'refused')),
    reason_code  TEXT    NOT NULL,
    intent_hash  TEXT,
    note         TEXT,
    at_us        INTEGER NOT NULL
);
CREATE INDEX agent_ledger_decision_attempts_key_idx
    ON agent_ledger_decision_attempts (idem_key, id);

CREATE TABLE agent_ledger_used_links (
    nonce       TEXT    PRIMARY KEY,
    idem_key    TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    used_by     TEXT    NOT NULL,
    used_us     INTEGER NOT NULL,
    expires_us  INTEGER NOT NULL
);

INSERT INTO agent_ledger_schema_version (version, applied_us)
    VALUES (4, CAST(strftime('%s', 'now') AS INTEGER) * 1000000);
