-- agent-ledger SQLite schema, version 3, applied once on top of version 2.
--
-- Sagas and their steps; model calls' usage and spend budgets; ambiguous
-- attempts. SqliteStore runs it under the write lock, and only when the
-- file's version is 2. What each column means, and why a step row is never
-- updated: see the version 3 section of the PostgreSQL schema
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

-- ---------------------------------------------------------------------------
-- Version 3, continued: model calls' usage, and spend budgets
-- ---------------------------------------------------------------------------
-- What each column means, and why a charge is booked once: see the same
-- part of the PostgreSQL schema. `usage` is JSON text, like `result`.
ALTER TABLE agent_ledger_effects ADD COLUMN usage TEXT;

CREATE TABLE agent_ledger_budgets (
    workflow_id             TEXT    PRIMARY KEY,
    limit_usd_micros        INTEGER CHECK (limit_usd_micros >= 0),
    limit_input_tokens      INTEGER CHECK (limit_input_tokens >= 0),
    limit_output_tokens     INTEGER CHECK (limit_output_tokens >= 0),
    limit_tool_calls        INTEGER CHECK (limit_tool_calls >= 0),
    spent_usd_micros        INTEGER NOT NULL DEFAULT 0 CHECK (spent_usd_micros >= 0),
    spent_input_tokens      INTEGER NOT NULL DEFAULT 0 CHECK (spent_input_tokens >= 0),
    spent_output_tokens     INTEGER NOT NULL DEFAULT 0 CHECK (spent_output_tokens >= 0),
    spent_tool_calls        INTEGER NOT NULL DEFAULT 0 CHECK (spent_tool_calls >= 0),
    reserved_usd_micros     INTEGER NOT NULL DEFAULT 0 CHECK (reserved_usd_micros >= 0),
    reserved_input_tokens   INTEGER NOT NULL DEFAULT 0 CHECK (reserved_input_tokens >= 0),
    reserved_output_tokens  INTEGER NOT NULL DEFAULT 0 CHECK (reserved_output_tokens >= 0),
    reserved_tool_calls     INTEGER NOT NULL DEFAULT 0 CHECK (reserved_tool_calls >= 0),
    created_us              INTEGER NOT NULL,
    updated_us              INTEGER NOT NULL
);
CREATE INDEX agent_ledger_budgets_updated_idx
    ON agent_ledger_budgets (updated_us DESC, workflow_id DESC);

CREATE TABLE agent_ledger_budget_holds (
    hold_id        TEXT    PRIMARY KEY,
    workflow_id    TEXT    NOT NULL
        REFERENCES agent_ledger_budgets (workflow_id) ON DELETE CASCADE,
    idem_key       TEXT    NOT NULL,
    usd_micros     INTEGER NOT NULL CHECK (usd_micros >= 0),
    input_tokens   INTEGER NOT NULL CHECK (input_tokens >= 0),
    output_tokens  INTEGER NOT NULL CHECK (output_tokens >= 0),
    tool_calls     INTEGER NOT NULL CHECK (tool_calls >= 0),
    created_us     INTEGER NOT NULL,
    expires_us     INTEGER NOT NULL
);
CREATE INDEX agent_ledger_budget_holds_key_idx
    ON agent_ledger_budget_holds (workflow_id, idem_key);
CREATE INDEX agent_ledger_budget_holds_expiry_idx
    ON agent_ledger_budget_holds (workflow_id, expires_us);

CREATE TABLE agent_ledger_budget_charges (
    workflow_id    TEXT    NOT NULL
        REFERENCES agent_ledger_budgets (workflow_id) ON DELETE CASCADE,
    idem_key       TEXT    NOT NULL,
    usd_micros     INTEGER NOT NULL CHECK (usd_micros >= 0),
    input_tokens   INTEGER NOT NULL CHECK (input_tokens >= 0),
    output_tokens  INTEGER NOT NULL CHECK (output_tokens >= 0),
    tool_calls     INTEGER NOT NULL CHECK (tool_calls >= 0),
    booked_us      INTEGER NOT NULL,
    PRIMARY KEY (workflow_id, idem_key)
);
-- Ambiguous attempts parked for a person: see the version 3 section of the
-- PostgreSQL schema. The attempt whose handler started under
-- on_stale="park" (NULL: none), and who ran it.
ALTER TABLE agent_ledger_effects
    ADD COLUMN park_attempt INTEGER CHECK (park_attempt >= 1);
ALTER TABLE agent_ledger_effects ADD COLUMN worker TEXT;

INSERT INTO agent_ledger_schema_version (version, applied_us)
    VALUES (3, CAST(strftime('%s', 'now') AS INTEGER) * 1000000);
