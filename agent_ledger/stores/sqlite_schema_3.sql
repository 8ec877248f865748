-- agent-ledger SQLite schema, version 3, applied once on top of version 2.
--
-- Sagas and their steps, and ambiguous attempts. SqliteStore runs it under
-- the write lock, and only when the file's version is 2. What each column means, and why a step row
-- is never updated: see the version 3 section of the PostgreSQL schema
-- (postgres_schema.sql). Times are integer microseconds, as elsewhere.

CREATE TABLE agent_ledger_sagas (
    saga_id                  TEXT    PRIMARY KEY,
    status                   TEXT    NOT NULL
        CONSTRAINT agent_ledger_sagas_status_check CHECK (status IN (
            'running', 'completed', 'compensating', 'compensated',
            'compensation_failed', 'canceled')),
    attempt                  INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    owner                    TEXT,
    lease_ms                 INTEGER NOT NULL CHECK (lease_ms >= 0),
    heartbeat_us             INTEGER NOT NULL,
    abandon_after_ms         INTEGER CHECK (abandon_after_ms >= 0),
    on_compensation_failure  TEXT    NOT NULL DEFAULT 'continue'
        CHECK (on_compensation_failure IN ('continue', 'stop')),
    error_message            TEXT,
    error_code               TEXT,
    created_us               INTEGER NOT NULL,
    updated_us               INTEGER NOT NULL,
    completed_us             INTEGER
);
CREATE INDEX agent_ledger_sagas_open_idx
    ON agent_ledger_sagas (status, heartbeat_us)
    WHERE status IN ('running', 'compensating');
CREATE INDEX agent_ledger_sagas_created_idx
    ON agent_ledger_sagas (created_us DESC, saga_id DESC);

CREATE TABLE agent_ledger_saga_steps (
    saga_id           TEXT    NOT NULL
        REFERENCES agent_ledger_sagas (saga_id) ON DELETE CASCADE,
    position          INTEGER NOT NULL CHECK (position >= 0),
    group_index       INTEGER NOT NULL CHECK (group_index >= 0),
    tool              TEXT    NOT NULL,
    idem_key          TEXT    NOT NULL,
    compensation      TEXT,
    compensation_key  TEXT,
    compensate_if     TEXT    NOT NULL CHECK (compensate_if IN ('succeeded', 'attempted')),
    created_us        INTEGER NOT NULL,
    PRIMARY KEY (saga_id, position)
);

-- Ambiguous attempts parked for a person: see the version 3 section of the
-- PostgreSQL schema. The attempt whose handler started under
-- on_stale="park" (NULL: none), and who ran it.
ALTER TABLE agent_ledger_effects
    ADD COLUMN park_attempt INTEGER CHECK (park_attempt >= 1);
ALTER TABLE agent_ledger_effects ADD COLUMN worker TEXT;

INSERT INTO agent_ledger_schema_version (version, applied_us)
    VALUES (3, CAST(strftime('%s', 'now') AS INTEGER) * 1000000);
