-- agent-ledger MariaDB / MySQL schema, version 4, applied once on top of version 3.
--
-- Approvals for people: each request's asker, policy version and deadline;
-- every decision attempt (the audit trail); the signed links already used.
-- What each column means: see the version 4 section of the PostgreSQL schema
-- (postgres_schema.sql). New tables only (MySQL cannot add a column
-- idempotently), each CREATE TABLE IF NOT EXISTS, and the version row
-- written last, so a half-finished attempt may run again.

CREATE TABLE IF NOT EXISTS agent_ledger_approvals (
    idem_key        VARCHAR(255) NOT NULL PRIMARY KEY,
    requested_by    TEXT,
    policy_version  TEXT,
    deadline_at     DATETIME(6),
    escalated_at    DATETIME(6),
    created_at      DATETIME(6)  NOT NULL,
    KEY agent_ledger_approvals_deadline_idx (deadline_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_decision_attempts (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    idem_key     VARCHAR(255) NOT NULL,
    principal    TEXT         NOT NULL,
    channel      VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    action       VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    outcome      VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    reason_code  VARCHAR(64)  NOT NULL,
    intent_hash  VARCHAR(64),
    note         LONGTEXT,
    at           DATETIME(6)  NOT NULL,
    KEY agent_ledger_decision_attempts_key_idx (idem_key, id),
    CONSTRAINT agent_ledger_decision_attempts_channel_check CHECK (channel IN (
        'console', 'link', 'slack', 'cli', 'code')),
    CONSTRAINT agent_ledger_decision_attempts_action_check CHECK (action IN (
        'approve', 'deny', 'resolve')),
    CONSTRAINT agent_ledger_decision_attempts_outcome_check CHECK (outcome IN (
        'accepted', 'refused'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_used_links (
    nonce       VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    idem_key    VARCHAR(255) NOT NULL,
    action      VARCHAR(16)  NOT NULL,
    used_by     TEXT         NOT NULL,
    used_at     DATETIME(6)  NOT NULL,
    expires_at  DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- Written last: a version is recorded only once all of it exists.
INSERT IGNORE INTO agent_ledger_schema_version (version, applied_at) VALUES (4, UTC_TIMESTAMP(6));
