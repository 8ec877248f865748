-- agent-ledger SQLite schema, version 2, applied once on top of version 1.
--
-- SqliteStore runs it under the write lock, and only when the file's
-- version is 1 (SQLite has no ADD COLUMN IF NOT EXISTS). Why these columns,
-- and how rows written before version 2 are estimated: see the version 2
-- section of the PostgreSQL schema (postgres_schema.sql).

-- The current holder's lease (its stale window) in ms; 0: never taken over.
ALTER TABLE agent_ledger_effects
    ADD COLUMN lease_ms INTEGER NOT NULL DEFAULT 15000 CHECK (lease_ms >= 0);
-- How many times a handler was started for this effect.
ALTER TABLE agent_ledger_effects
    ADD COLUMN executions INTEGER NOT NULL DEFAULT 0 CHECK (executions >= 0);
-- When the last execution started, in µs (the claim that handed it to a handler).
ALTER TABLE agent_ledger_effects ADD COLUMN started_us INTEGER;
-- How many tries of the handler ended in the current run.
ALTER TABLE agent_ledger_effects
    ADD COLUMN tries INTEGER NOT NULL DEFAULT 0 CHECK (tries >= 0);
-- JSON array of what happened before the outcome: failed tries, reopenings.
ALTER TABLE agent_ledger_effects ADD COLUMN history TEXT NOT NULL DEFAULT '[]';

-- 0.2.x's key of an imported call -> the imported effect's key (see the
-- PostgreSQL schema's version 2 section).
CREATE TABLE agent_ledger_legacy_keys (
    legacy_key  TEXT PRIMARY KEY,
    idem_key    TEXT NOT NULL
);

UPDATE agent_ledger_effects SET
    executions = CASE
        WHEN status IN ('requires_approval', 'ready', 'denied') THEN 0
        WHEN decided_us IS NOT NULL AND status <> 'canceled' THEN max(attempt - 1, 0)
        ELSE attempt
    END,
    started_us = CASE
        WHEN status IN ('requires_approval', 'ready', 'denied') THEN NULL
        WHEN decided_us IS NOT NULL AND status <> 'canceled' THEN decided_us
        ELSE created_us
    END;

INSERT INTO agent_ledger_schema_version (version, applied_us)
    VALUES (2, CAST(strftime('%s', 'now') AS INTEGER) * 1000000);
