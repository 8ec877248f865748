-- agent-ledger PostgreSQL schema, version 4 (PostgreSQL 14 or later).
--
-- Apply it with `psql -f schema.sql`, `await conn.execute(SCHEMA_SQL)` or
-- `await store.create_schema()`. It is idempotent: applying it twice is a
-- no-op. Objects are created in the first schema of the search_path
-- (normally `public`); `PostgresStore(pool, schema="x")` looks in schema x,
-- and `store.create_schema()` creates them there.
--
-- Upgrades: the file is every version in order. Version 1 creates the
-- tables; each later version is a section at the end that changes them once,
-- guarded by its row in `agent_ledger_schema_version`. Applying the whole
-- file (`create_schema()`, `agent-ledger init`, or psql) therefore creates a
-- new database or upgrades an old one to the newest version, and does nothing
-- on a current one. A released version's section is never edited.
-- `PostgresStore.check_schema()` names the version it needs.

-- ---------------------------------------------------------------------------
-- Version marker
-- ---------------------------------------------------------------------------
CREATE TABLE IF NOT EXISTS agent_ledger_schema_version (
    version     integer     PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO agent_ledger_schema_version (version) VALUES (1) ON CONFLICT (version) DO NOTHING;

-- ---------------------------------------------------------------------------
-- Effects: one row per idempotency key, the receipt of one tool call
-- ---------------------------------------------------------------------------
CREATE TABLE IF NOT EXISTS agent_ledger_effects (
    id                     uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- SHA-256 hex of the call's identity (see the README: "The idempotency key").
    idem_key               text        NOT NULL,
    workflow_id            text        NOT NULL,
    -- The caller's own label for the invocation; not part of the key.
    call_id                text,
    tool                   text        NOT NULL,
    -- Mirrors agent_ledger.status.EffectStatus; a test keeps the two equal.
    --   processing         a worker holds the effect (attempt n) and runs the handler
    --   succeeded          terminal: result is the receipt
    --   failed             terminal: error says why
    --   requires_approval  waiting for a human
    --   ready              approved; the next claim runs the handler
    --   denied             terminal: a human said no
    --   canceled           terminal: canceled by an admin or a cancelled task
    status                 text        NOT NULL
        CONSTRAINT agent_ledger_effects_status_check CHECK (status IN (
            'processing', 'succeeded', 'failed', 'requires_approval',
            'ready', 'denied', 'canceled')),
    -- Canonical JSON text, kept byte for byte (jsonb would reorder keys);
    -- query it with args_canonical::json (::jsonb refuses a \u0000 escape).
    args_canonical         text        NOT NULL,
    resource_id_canonical  text,
    -- The handler's result. `json`, not `jsonb`, on purpose: jsonb rewrites
    -- numbers (1e16 becomes 10000000000000000, -0.0 becomes 0, and the float
    -- 6.051451965959453e+16 comes back as the integer 60514519659594530),
    -- and a receipt must give back exactly what was recorded. `->`/`->>` work
    -- on json too; cast with result::jsonb to use jsonb operators.
    result                 json,
    -- {"message": ..., "code": ...} for failed, denied and canceled effects.
    error                  jsonb,
    -- Calls after the first that asked for this same effect.
    dedup_count            integer     NOT NULL DEFAULT 0 CHECK (dedup_count >= 0),
    -- Fencing token: +1 on every claim (fresh, ready -> processing, takeover).
    attempt                integer     NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    created_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Moves on status changes only.
    updated_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at           timestamptz,
    -- Last sign of life from the worker holding the current attempt, by the
    -- database clock. Staleness is judged against clock_timestamp(), never
    -- against a worker's clock.
    heartbeat_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Who approved, denied or canceled it, their note, and when (as told to the ledger).
    decided_by             text,
    decision_note          text,
    decided_at             timestamptz
);

CREATE UNIQUE INDEX IF NOT EXISTS agent_ledger_effects_idem_key_idx
    ON agent_ledger_effects (idem_key);
-- The audit trail, newest first, paged by (created_at, id).
CREATE INDEX IF NOT EXISTS agent_ledger_effects_created_idx
    ON agent_ledger_effects (created_at DESC, id DESC);
-- "What did this workflow do?", newest first.
CREATE INDEX IF NOT EXISTS agent_ledger_effects_workflow_idx
    ON agent_ledger_effects (workflow_id, created_at DESC);
-- Pending work: effects in flight or waiting for a human (small: terminal rows are excluded).
CREATE INDEX IF NOT EXISTS agent_ledger_effects_open_idx
    ON agent_ledger_effects (status, heartbeat_at)
    WHERE status IN ('processing', 'requires_approval', 'ready');

-- ---------------------------------------------------------------------------
-- Notifications: wake waiting callers when an effect changes status
-- ---------------------------------------------------------------------------
-- Channel `agent_ledger`, payload `<schema>:<idem_key>`. NOTIFY is
-- transactional: a change made inside a transaction is announced at commit.
-- The common case, a fresh effect finishing with nobody else asking for it
-- (dedup_count = 0), needs no wake-up and sends none: NOTIFY serializes
-- committing transactions, so it is kept off the hot path. Any caller that
-- could be waiting has already incremented dedup_count, or is waiting on a
-- decision (requires_approval/ready/denied/canceled), which always notifies.
CREATE OR REPLACE FUNCTION agent_ledger_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agent_ledger', TG_TABLE_SCHEMA || ':' || NEW.idem_key);
    RETURN NULL;
END;
$$;

-- CREATE OR REPLACE TRIGGER (PostgreSQL 14+) never leaves a moment without it.
CREATE OR REPLACE TRIGGER agent_ledger_effects_notify
    AFTER UPDATE OF status ON agent_ledger_effects
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.dedup_count > 0
               OR OLD.status <> 'processing'
               OR NEW.status NOT IN ('succeeded', 'failed')))
    EXECUTE FUNCTION agent_ledger_notify_change();

-- ===========================================================================
-- Version 2: the holder's lease, handler executions, when the last run began,
-- tries and history
-- ===========================================================================
-- Until version 1 a waiter judged another worker's heartbeat against its own
-- stale window, so a caller with a short window took over a live worker that
-- had asked for a long one. Now each holder records its lease when it claims
-- the effect, and a takeover needs a heartbeat older than that lease.
-- `attempt` stays the fencing token; `executions` counts the times a handler
-- was started (an approval adds an attempt but runs nothing), and
-- `started_at` separates the time spent waiting for a person from the run.
--
-- Rows written before version 2 get the default lease (the library's default
-- stale window), and an estimate of their executions and start, erring
-- towards "it ran": an effect waiting for, or refused by, a person never ran;
-- one with a decision that went on to run was approved, so it ran
-- attempt - 1 times, from about when it was approved; a canceled one counts
-- attempt runs, since its cancel may have stopped a running handler (a cancel
-- records a decision too, so the data cannot tell).
--
-- `tries` and `history` make retries durable: a retried handler records each
-- failed try (one statement, fenced by the attempt) before the next, so a
-- worker that takes the effect over continues the count, and the receipt
-- keeps every try's error; a person's reopen of a failed or canceled effect
-- is kept there too. Rows from before version 2 start with 0 tries (they
-- were not counted) and an empty history.
--
-- `agent_ledger_legacy_keys` maps the key agent-ledger 0.2.x gave a call
-- to the key of the effect `agent-ledger import-0.2` made of it, so that
-- `EffectLedgerOptions(legacy_keys=True)` answers a call whose key here
-- differs from the one the importer recomputed (docs/migrating-from-0.2.md).
DO $version_2$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_ledger_schema_version WHERE version = 2) THEN
        RETURN;
    END IF;
    ALTER TABLE agent_ledger_effects
        -- The current holder's lease (its stale window) in ms: it may be taken
        -- over only after this long without a heartbeat. 0: never.
        ADD COLUMN lease_ms integer NOT NULL DEFAULT 15000 CHECK (lease_ms >= 0),
        -- How many times a handler was started for this effect.
        ADD COLUMN executions integer NOT NULL DEFAULT 0 CHECK (executions >= 0),
        -- When the last execution started (the claim that handed it to a handler).
        ADD COLUMN started_at timestamptz,
        -- How many tries of the handler ended in the current run.
        ADD COLUMN tries integer NOT NULL DEFAULT 0 CHECK (tries >= 0),
        -- What happened before the outcome, oldest first: a JSON array of
        -- {"kind": "try_failed", "try", "attempt", "message", "code", "type", "at"}
        -- and {"kind": "reopened", "status", "error", "tries", "by", "reason", "at"}.
        ADD COLUMN history jsonb NOT NULL DEFAULT '[]';
    CREATE TABLE agent_ledger_legacy_keys (
        -- SHA-256 hex of 0.2.x's `workflow|tool|identity` text.
        legacy_key  text PRIMARY KEY,
        -- The imported effect's key; the effect is looked up by it, so a
        -- purged effect leaves a mapping that answers nothing.
        idem_key    text NOT NULL
    );
    UPDATE agent_ledger_effects SET
        executions = CASE
            WHEN status IN ('requires_approval', 'ready', 'denied') THEN 0
            WHEN decided_at IS NOT NULL AND status <> 'canceled' THEN greatest(attempt - 1, 0)
            ELSE attempt
        END,
        started_at = CASE
            WHEN status IN ('requires_approval', 'ready', 'denied') THEN NULL
            WHEN decided_at IS NOT NULL AND status <> 'canceled' THEN decided_at
            ELSE created_at
        END;
    INSERT INTO agent_ledger_schema_version (version) VALUES (2);
END
$version_2$;

-- ===========================================================================
-- Version 3: sagas and their steps; model calls' usage and spend budgets;
-- ambiguous attempts parked for a person
-- ===========================================================================
-- A saga (docs/sagas.md) is a row with a fenced owner, exactly as an effect
-- has one: `attempt` is the fencing token (+1 on every claim: a re-run of
-- the saga's code under the same id, or `recover_sagas()`), and the owner
-- heartbeats `heartbeat_at` within its `lease_ms`. Its steps say which
-- effect each position is (the forward key) and how to undo it (the
-- compensation tool and the key of its effect, derived from the forward
-- key). A step row is written once, before its forward effect begins, and
-- never updated: what happened to a step is its effects' status, so the two
-- can never disagree. Nothing existing changes; a version 2 ledger simply
-- has no sagas yet.
DO $version_3$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_ledger_schema_version WHERE version = 3) THEN
        RETURN;
    END IF;
    CREATE TABLE agent_ledger_sagas (
        saga_id                  text        PRIMARY KEY,
        -- Mirrors agent_ledger.stores.saga_base.SagaStatus; a test keeps the two equal.
        status                   text        NOT NULL
            CONSTRAINT agent_ledger_sagas_status_check CHECK (status IN (
                'running', 'completed', 'compensating', 'compensated',
                'compensation_failed', 'canceled')),
        attempt                  integer     NOT NULL DEFAULT 1 CHECK (attempt >= 1),
        -- Who holds it, for people (host:pid by default).
        owner                    text,
        -- The holder's lease in ms; 0: never taken over.
        lease_ms                 integer     NOT NULL CHECK (lease_ms >= 0),
        heartbeat_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
        -- A running saga idle this long is compensated by recover_sagas(); NULL: never.
        abandon_after_ms         bigint      CHECK (abandon_after_ms >= 0),
        on_compensation_failure  text        NOT NULL DEFAULT 'continue'
            CHECK (on_compensation_failure IN ('continue', 'stop')),
        -- {"message": ..., "code": ...}: why it was rolled back.
        error                    jsonb,
        created_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
        updated_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
        completed_at             timestamptz
    );
    -- Sagas a recoverer may claim (small: finished sagas are excluded).
    CREATE INDEX agent_ledger_sagas_open_idx
        ON agent_ledger_sagas (status, heartbeat_at)
        WHERE status IN ('running', 'compensating');
    CREATE INDEX agent_ledger_sagas_created_idx
        ON agent_ledger_sagas (created_at DESC, saga_id DESC);
    CREATE TABLE agent_ledger_saga_steps (
        saga_id           text        NOT NULL
            REFERENCES agent_ledger_sagas (saga_id) ON DELETE CASCADE,
        -- The order the saga's code reached the step in, from 0.
        position          integer     NOT NULL CHECK (position >= 0),
        -- Steps of one parallel group share it; they are undone together.
        group_index       integer     NOT NULL CHECK (group_index >= 0),
        tool              text        NOT NULL,
        -- The forward effect's key (agent_ledger_effects.idem_key).
        idem_key          text        NOT NULL,
        compensation      text,
        compensation_key  text,
        compensate_if     text        NOT NULL
            CHECK (compensate_if IN ('succeeded', 'attempted')),
        created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (saga_id, position)
    );

    -- -----------------------------------------------------------------------
    -- Version 3, continued: model calls' usage, and spend budgets
    -- -----------------------------------------------------------------------
    -- `usage` is what a model call consumed ({"input_tokens", "output_tokens",
    -- "cost_usd"}), recorded by ledger.llm() in the statement that records
    -- its outcome; NULL for every other effect (and for every version 2 row).
    -- A budget (docs/budgets.md) is one row per workflow id: its limits
    -- (NULL: unlimited), what was booked (`spent_*`) and what calls in flight
    -- hold (`reserved_*`), dollars in millionths. A hold is one call's
    -- reservation until its effect is booked, it is released, or it expires;
    -- a charge is one booked effect, at most once per budget (its primary
    -- key), so replays and a second worker book nothing.
    ALTER TABLE agent_ledger_effects ADD COLUMN usage json;
    CREATE TABLE agent_ledger_budgets (
        workflow_id             text        PRIMARY KEY,
        limit_usd_micros        bigint      CHECK (limit_usd_micros >= 0),
        limit_input_tokens      bigint      CHECK (limit_input_tokens >= 0),
        limit_output_tokens     bigint      CHECK (limit_output_tokens >= 0),
        limit_tool_calls        bigint      CHECK (limit_tool_calls >= 0),
        spent_usd_micros        bigint      NOT NULL DEFAULT 0 CHECK (spent_usd_micros >= 0),
        spent_input_tokens      bigint      NOT NULL DEFAULT 0 CHECK (spent_input_tokens >= 0),
        spent_output_tokens     bigint      NOT NULL DEFAULT 0 CHECK (spent_output_tokens >= 0),
        spent_tool_calls        bigint      NOT NULL DEFAULT 0 CHECK (spent_tool_calls >= 0),
        reserved_usd_micros     bigint      NOT NULL DEFAULT 0 CHECK (reserved_usd_micros >= 0),
        reserved_input_tokens   bigint      NOT NULL DEFAULT 0 CHECK (reserved_input_tokens >= 0),
        reserved_output_tokens  bigint      NOT NULL DEFAULT 0 CHECK (reserved_output_tokens >= 0),
        reserved_tool_calls     bigint      NOT NULL DEFAULT 0 CHECK (reserved_tool_calls >= 0),
        created_at              timestamptz NOT NULL DEFAULT clock_timestamp(),
        updated_at              timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    CREATE INDEX agent_ledger_budgets_updated_idx
        ON agent_ledger_budgets (updated_at DESC, workflow_id DESC);
    CREATE TABLE agent_ledger_budget_holds (
        -- Chosen by the caller before it reserves (a UUID), so that a caller
        -- cut off mid-statement can still release it.
        hold_id        text        PRIMARY KEY,
        workflow_id    text        NOT NULL
            REFERENCES agent_ledger_budgets (workflow_id) ON DELETE CASCADE,
        -- The effect it holds room for; booking that effect releases it.
        idem_key       text        NOT NULL,
        usd_micros     bigint      NOT NULL CHECK (usd_micros >= 0),
        input_tokens   bigint      NOT NULL CHECK (input_tokens >= 0),
        output_tokens  bigint      NOT NULL CHECK (output_tokens >= 0),
        tool_calls     bigint      NOT NULL CHECK (tool_calls >= 0),
        created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
        -- After this, a reclaim gives its room back (its caller is gone).
        expires_at     timestamptz NOT NULL
    );
    CREATE INDEX agent_ledger_budget_holds_key_idx
        ON agent_ledger_budget_holds (workflow_id, idem_key);
    CREATE INDEX agent_ledger_budget_holds_expiry_idx
        ON agent_ledger_budget_holds (workflow_id, expires_at);
    CREATE TABLE agent_ledger_budget_charges (
        workflow_id    text        NOT NULL
            REFERENCES agent_ledger_budgets (workflow_id) ON DELETE CASCADE,
        idem_key       text        NOT NULL,
        usd_micros     bigint      NOT NULL CHECK (usd_micros >= 0),
        input_tokens   bigint      NOT NULL CHECK (input_tokens >= 0),
        output_tokens  bigint      NOT NULL CHECK (output_tokens >= 0),
        tool_calls     bigint      NOT NULL CHECK (tool_calls >= 0),
        booked_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (workflow_id, idem_key)
    );

    -- -----------------------------------------------------------------------
    -- Version 3, ambiguous attempts parked for a person (docs/choosing-recovery.md).
    -- A run under on_stale="park" records, fenced by its attempt, that its
    -- handler starts, and who runs it. If that attempt's holder then goes
    -- silent for its lease, nobody knows whether the side effect happened:
    -- the effect is parked (processing -> requires_approval, error code
    -- ambiguous_attempt) instead of taken over, and a person settles it
    -- (approve, deny, or resolve it as succeeded/failed). An attempt whose
    -- handler never started is still taken over. Rows from before version 3
    -- have neither value: they are taken over as before.
    ALTER TABLE agent_ledger_effects
        -- The attempt whose handler started under on_stale="park"; NULL: none.
        ADD COLUMN park_attempt integer CHECK (park_attempt >= 1),
        -- Who ran that handler (host:pid by default), for the person who settles it.
        ADD COLUMN worker text;
    -- -----------------------------------------------------------------------
    INSERT INTO agent_ledger_schema_version (version) VALUES (3);
END
$version_3$;

-- ===========================================================================
-- Version 4: approvals for people (docs/console.md): who asked, the policy
-- version and the deadline of each request; every decision attempt; links
-- already used
-- ===========================================================================
-- An effect that waits for a person gets a row in agent_ledger_approvals,
-- beside its effect row rather than as new effect columns: the effect record
-- and the statements on every run's path stay as they were, and the MySQL
-- store (whose DDL cannot add a column idempotently) keeps the same layout.
-- A decision is bound to what the person was shown: the SHA-256 of the
-- canonical (tool, workflow, args, policy version), the "intent hash"
-- (agent_ledger/intent.py). Each attempt to decide, accepted or refused,
-- is one row of agent_ledger_decision_attempts, the audit trail: who (the
-- authenticated principal), through which channel, what they asked, the
-- intent hash they saw, and a reason code (agent_ledger.codes.DecisionCode).
-- A signed link is single-use: its nonce is inserted into
-- agent_ledger_used_links in the transaction that records the decision, so
-- a link either decided once or changed nothing. Nothing existing changes;
-- a version 3 ledger simply has no requests recorded yet.
DO $version_4$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_ledger_schema_version WHERE version = 4) THEN
        RETURN;
    END IF;
    CREATE TABLE agent_ledger_approvals (
        -- The effect waiting for a person (agent_ledger_effects.idem_key).
        idem_key        text        PRIMARY KEY,
        -- Who asked (the worker's principal or database role); NULL: not said.
        requested_by    text,
        -- The version of the approval policy that sent it to a person; part of
        -- the intent hash, so a decision made under another policy never runs.
        policy_version  text,
        -- Past this, a sweep (or the console, on reading it) denies the effect
        -- with reason `expired`; NULL: no deadline.
        deadline_at     timestamptz,
        -- When the escalation hook fired (once per request); NULL: not yet.
        escalated_at    timestamptz,
        created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    -- Requests with a deadline, for the sweep.
    CREATE INDEX agent_ledger_approvals_deadline_idx
        ON agent_ledger_approvals (deadline_at) WHERE deadline_at IS NOT NULL;
    CREATE TABLE agent_ledger_decision_attempts (
        id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        idem_key     text        NOT NULL,
        -- The authenticated principal (never a name taken from the request body).
        principal    text        NOT NULL,
        channel      text        NOT NULL
            CONSTRAINT agent_ledger_decision_attempts_channel_check CHECK (channel IN (
                'console', 'link', 'slack', 'cli', 'code')),
        action       text        NOT NULL
            CONSTRAINT agent_ledger_decision_attempts_action_check CHECK (action IN (
                'approve', 'deny', 'resolve')),
        outcome      text        NOT NULL
            CONSTRAINT agent_ledger_decision_attempts_outcome_check CHECK (outcome IN (
                'accepted', 'refused')),
        -- agent_ledger.codes.DecisionCode: why it was accepted or refused.
        reason_code  text        NOT NULL,
        -- The intent hash the decider was shown (lowercase hex); NULL: none sent.
        intent_hash  text,
        note         text,
        at           timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    CREATE INDEX agent_ledger_decision_attempts_key_idx
        ON agent_ledger_decision_attempts (idem_key, id);
    CREATE TABLE agent_ledger_used_links (
        -- The link's random nonce: present once the link has decided.
        nonce       text        PRIMARY KEY,
        idem_key    text        NOT NULL,
        action      text        NOT NULL,
        used_by     text        NOT NULL,
        used_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
        -- The link's own expiry: a row past it may be deleted (the link is dead anyway).
        expires_at  timestamptz NOT NULL
    );
    INSERT INTO agent_ledger_schema_version (version) VALUES (4);
END
$version_4$;
