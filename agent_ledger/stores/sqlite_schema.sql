-- agent-ledger SQLite schema, version 1 (SQLite 3.35 or later).
--
-- SqliteStore applies it when it opens a database (create=True, the
-- default); it is idempotent. Later versions are sqlite_schema_<N>.sql,
-- applied once each, in order, on top of this (see SqliteStore.create_schema);
-- a released version's file is never edited. Timestamps are integer microseconds since the
-- Unix epoch, UTC, so they compare exactly. Mirrors the PostgreSQL schema
-- (schema.sql); the comments there describe each column.

CREATE TABLE IF NOT EXISTS agent_ledger_schema_version (
    version     INTEGER PRIMARY KEY,
    applied_us  INTEGER NOT NULL
);
INSERT OR IGNORE INTO agent_ledger_schema_version (version, applied_us)
    VALUES (1, CAST(strftime('%s', 'now') AS INTEGER) * 1000000);

CREATE TABLE IF NOT EXISTS agent_ledger_effects (
    id                     TEXT    PRIMARY KEY,
    idem_key               TEXT    NOT NULL UNIQUE,
    workflow_id            TEXT    NOT NULL,
    call_id                TEXT,
    tool                   TEXT    NOT NULL,
    status                 TEXT    NOT NULL
        CONSTRAINT agent_ledger_effects_status_check CHECK (status IN (
            'processing', 'succeeded', 'failed', 'requires_approval',
            'ready', 'denied', 'canceled')),
    args_canonical         TEXT    NOT NULL,
    resource_id_canonical  TEXT,
    -- JSON text of the handler's result, exactly as encoded.
    result                 TEXT,
    error_message          TEXT,
    error_code             TEXT,
    dedup_count            INTEGER NOT NULL DEFAULT 0 CHECK (dedup_count >= 0),
    attempt                INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    created_us             INTEGER NOT NULL,
    updated_us             INTEGER NOT NULL,
    completed_us           INTEGER,
    heartbeat_us           INTEGER NOT NULL,
    decided_by             TEXT,
    decision_note          TEXT,
    decided_us             INTEGER
);

CREATE INDEX IF NOT EXISTS agent_ledger_effects_created_idx
    ON agent_ledger_effects (created_us DESC, id DESC);
CREATE INDEX IF NOT EXISTS agent_ledger_effects_workflow_idx
    ON agent_ledger_effects (workflow_id, created_us DESC);
CREATE INDEX IF NOT EXISTS agent_ledger_effects_open_idx
    ON agent_ledger_effects (status, heartbeat_us)
    WHERE status IN ('processing', 'requires_approval', 'ready');
