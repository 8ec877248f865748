-- agent-ledger MariaDB / MySQL schema, version 3 (MariaDB 10.6+; MySQL 8.0.16+).
--
-- MySQLStore applies it with `await store.create_schema()` or
-- `agent-ledger init --url mysql://...`; it is idempotent. The tables are
-- those of version 3 of the PostgreSQL and SQLite schemas (whose comments
-- describe each column), in MySQL's types, and the version is numbered the
-- same: the MySQL tables start at 3. Later versions will be
-- mysql_schema_<N>.sql (N >= 4), applied once each, in order, on top of this, and
-- recorded in agent_ledger_schema_version; a released version's file is never
-- edited.
--
-- MySQL's DDL commits as it goes (no transactional DDL), so every statement
-- here may run again after a half-finished attempt: CREATE TABLE IF NOT
-- EXISTS with the indexes inside, and the version row written last. Several
-- workers applying it at once take turns on GET_LOCK('agent_ledger_schema').
--
-- {collation} is filled in once, at connect time: utf8mb4_nopad_bin on
-- MariaDB, utf8mb4_0900_bin on MySQL 8. Both compare text byte for byte and
-- without padding, so 'wf' and 'wf ' or 'A' and 'a' are different workflows,
-- as they are on the other stores (MySQL's default collations ignore case
-- and trailing spaces).
--
-- Times are DATETIME(6) in UTC (microseconds), always written from the
-- database's own clock, UTC_TIMESTAMP(6), never from a worker's.
-- Names that are primary keys (saga ids, budget workflow ids, hold ids) are
-- VARCHAR(512): InnoDB cannot make a unique index of unbounded text. A
-- longer one is refused with an error, never truncated.

CREATE TABLE IF NOT EXISTS agent_ledger_schema_version (
    version     INT         NOT NULL PRIMARY KEY,
    applied_at  DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_effects (
    id                     CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idem_key               VARCHAR(255) NOT NULL,
    workflow_id            TEXT         NOT NULL,
    call_id                TEXT,
    tool                   TEXT         NOT NULL,
    status                 VARCHAR(20)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Canonical JSON text, kept byte for byte (JSON columns would reorder
    -- keys and rewrite numbers; in MariaDB JSON is LONGTEXT anyway).
    args_canonical         LONGTEXT     NOT NULL,
    resource_id_canonical  LONGTEXT,
    result                 LONGTEXT,
    error_message          LONGTEXT,
    error_code             TEXT,
    dedup_count            INT          NOT NULL DEFAULT 0,
    attempt                INT          NOT NULL DEFAULT 1,
    created_at             DATETIME(6)  NOT NULL,
    updated_at             DATETIME(6)  NOT NULL,
    completed_at           DATETIME(6),
    heartbeat_at           DATETIME(6)  NOT NULL,
    decided_by             TEXT,
    decision_note          LONGTEXT,
    decided_at             DATETIME(6),
    started_at             DATETIME(6),
    executions             INT          NOT NULL DEFAULT 0,
    lease_ms               INT          NOT NULL,
    tries                  INT          NOT NULL DEFAULT 0,
    -- JSON array text of what happened before the outcome (failed tries,
    -- reopenings, parks, settlements), appended with JSON_ARRAY_APPEND.
    history                LONGTEXT     NOT NULL,
    -- `usage` is a reserved word in MySQL: always quoted.
    `usage`                LONGTEXT,
    park_attempt           INT,
    worker                 TEXT,
    PRIMARY KEY (id),
    UNIQUE KEY agent_ledger_effects_idem_key_idx (idem_key),
    -- The audit trail, newest first, paged by (created_at, id).
    KEY agent_ledger_effects_created_idx (created_at, id),
    -- "What did this workflow do?", newest first.
    KEY agent_ledger_effects_workflow_idx (workflow_id(191), created_at),
    -- Pending work and takeovers.
    KEY agent_ledger_effects_open_idx (status, heartbeat_at),
    CONSTRAINT agent_ledger_effects_status_check CHECK (status IN (
        'processing', 'succeeded', 'failed', 'requires_approval',
        'ready', 'denied', 'canceled')),
    CONSTRAINT agent_ledger_effects_counts_check CHECK (dedup_count >= 0 AND attempt >= 1
        AND executions >= 0 AND lease_ms >= 0 AND tries >= 0
        AND (park_attempt IS NULL OR park_attempt >= 1))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- 0.2.x's key of an imported call -> the imported effect's key.
CREATE TABLE IF NOT EXISTS agent_ledger_legacy_keys (
    legacy_key  VARCHAR(255) NOT NULL PRIMARY KEY,
    idem_key    VARCHAR(255) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_sagas (
    saga_id                  VARCHAR(512) NOT NULL PRIMARY KEY,
    status                   VARCHAR(32)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempt                  INT          NOT NULL DEFAULT 1,
    owner                    TEXT,
    lease_ms                 INT          NOT NULL,
    heartbeat_at             DATETIME(6)  NOT NULL,
    abandon_after_ms         BIGINT,
    on_compensation_failure  VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    error_message            LONGTEXT,
    error_code               TEXT,
    created_at               DATETIME(6)  NOT NULL,
    updated_at               DATETIME(6)  NOT NULL,
    completed_at             DATETIME(6),
    KEY agent_ledger_sagas_open_idx (status, heartbeat_at),
    KEY agent_ledger_sagas_created_idx (created_at, saga_id),
    CONSTRAINT agent_ledger_sagas_status_check CHECK (status IN (
        'running', 'completed', 'compensating', 'compensated',
        'compensation_failed', 'canceled')),
    CONSTRAINT agent_ledger_sagas_values_check CHECK (attempt >= 1 AND lease_ms >= 0
        AND (abandon_after_ms IS NULL OR abandon_after_ms >= 0)
        AND on_compensation_failure IN ('continue', 'stop'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_saga_steps (
    saga_id           VARCHAR(512) NOT NULL,
    position          INT          NOT NULL,
    group_index       INT          NOT NULL,
    tool              TEXT         NOT NULL,
    idem_key          VARCHAR(255) NOT NULL,
    compensation      TEXT,
    compensation_key  VARCHAR(255),
    compensate_if     VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    created_at        DATETIME(6)  NOT NULL,
    PRIMARY KEY (saga_id, position),
    CONSTRAINT agent_ledger_saga_steps_saga_fk FOREIGN KEY (saga_id)
        REFERENCES agent_ledger_sagas (saga_id) ON DELETE CASCADE,
    CONSTRAINT agent_ledger_saga_steps_values_check CHECK (position >= 0 AND group_index >= 0
        AND compensate_if IN ('succeeded', 'attempted'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_budgets (
    workflow_id             VARCHAR(512) NOT NULL PRIMARY KEY,
    limit_usd_micros        BIGINT,
    limit_input_tokens      BIGINT,
    limit_output_tokens     BIGINT,
    limit_tool_calls        BIGINT,
    spent_usd_micros        BIGINT       NOT NULL DEFAULT 0,
    spent_input_tokens      BIGINT       NOT NULL DEFAULT 0,
    spent_output_tokens     BIGINT       NOT NULL DEFAULT 0,
    spent_tool_calls        BIGINT       NOT NULL DEFAULT 0,
    reserved_usd_micros     BIGINT       NOT NULL DEFAULT 0,
    reserved_input_tokens   BIGINT       NOT NULL DEFAULT 0,
    reserved_output_tokens  BIGINT       NOT NULL DEFAULT 0,
    reserved_tool_calls     BIGINT       NOT NULL DEFAULT 0,
    created_at              DATETIME(6)  NOT NULL,
    updated_at              DATETIME(6)  NOT NULL,
    KEY agent_ledger_budgets_updated_idx (updated_at, workflow_id),
    CONSTRAINT agent_ledger_budgets_values_check CHECK (
        (limit_usd_micros IS NULL OR limit_usd_micros >= 0)
        AND (limit_input_tokens IS NULL OR limit_input_tokens >= 0)
        AND (limit_output_tokens IS NULL OR limit_output_tokens >= 0)
        AND (limit_tool_calls IS NULL OR limit_tool_calls >= 0)
        AND spent_usd_micros >= 0 AND spent_input_tokens >= 0
        AND spent_output_tokens >= 0 AND spent_tool_calls >= 0
        AND reserved_usd_micros >= 0 AND reserved_input_tokens >= 0
        AND reserved_output_tokens >= 0 AND reserved_tool_calls >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_budget_holds (
    hold_id        VARCHAR(512) NOT NULL PRIMARY KEY,
    workflow_id    VARCHAR(512) NOT NULL,
    -- The effect it holds room for; a detached hold's key is longer (see
    -- stores/budget_base.py, detach_hold).
    idem_key       VARCHAR(1024) NOT NULL,
    usd_micros     BIGINT       NOT NULL,
    input_tokens   BIGINT       NOT NULL,
    output_tokens  BIGINT       NOT NULL,
    tool_calls     BIGINT       NOT NULL,
    created_at     DATETIME(6)  NOT NULL,
    expires_at     DATETIME(6)  NOT NULL,
    KEY agent_ledger_budget_holds_key_idx (workflow_id, idem_key(191)),
    KEY agent_ledger_budget_holds_expiry_idx (workflow_id, expires_at),
    CONSTRAINT agent_ledger_budget_holds_budget_fk FOREIGN KEY (workflow_id)
        REFERENCES agent_ledger_budgets (workflow_id) ON DELETE CASCADE,
    CONSTRAINT agent_ledger_budget_holds_values_check CHECK (usd_micros >= 0
        AND input_tokens >= 0 AND output_tokens >= 0 AND tool_calls >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

CREATE TABLE IF NOT EXISTS agent_ledger_budget_charges (
    workflow_id    VARCHAR(512) NOT NULL,
    idem_key       VARCHAR(255) NOT NULL,
    usd_micros     BIGINT       NOT NULL,
    input_tokens   BIGINT       NOT NULL,
    output_tokens  BIGINT       NOT NULL,
    tool_calls     BIGINT       NOT NULL,
    booked_at      DATETIME(6)  NOT NULL,
    PRIMARY KEY (workflow_id, idem_key),
    CONSTRAINT agent_ledger_budget_charges_budget_fk FOREIGN KEY (workflow_id)
        REFERENCES agent_ledger_budgets (workflow_id) ON DELETE CASCADE,
    CONSTRAINT agent_ledger_budget_charges_values_check CHECK (usd_micros >= 0
        AND input_tokens >= 0 AND output_tokens >= 0 AND tool_calls >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- Written last: a version is recorded only once all of it exists.
INSERT IGNORE INTO agent_ledger_schema_version (version, applied_at) VALUES (3, UTC_TIMESTAMP(6));
