-- agent-ledger PostgreSQL: roles and separation of duty (opt-in).
--
-- Not a schema version: a deployment layer over any version from 4 on,
-- applied by `agent-ledger init --roles` (or `await store.install_roles()`)
-- after the tables exist, and applied again, unchanged, by every later run
-- (re-run it after each upgrade: a later version's new tables get their
-- grants and owner then). docs/postgres.md, "Roles", explains the set.
--
-- PostgresStore fills the braced names with psycopg.sql before it runs the
-- file: `owner`, `worker`, `approver` are the three role identifiers,
-- `owner_name`, `worker_name`, `approver_name` the same names as literals,
-- `schema` the schema identifier and `schema_name` its literal; every other
-- braced name is a schema-qualified table or function. Nothing else of the
-- caller's is in it. The file contains no other braces.
--
-- * Three NOLOGIN group roles, created if missing: the owner owns the
--   ledger's tables and functions and migrates them; the worker does what
--   the engine does (begin, claim, heartbeat, commit, budgets, sagas, asking
--   for approval) and decides nothing; the approver decides (approve, deny,
--   resolve, reopen), writes the decision audit trail and consumes signed
--   links. People and services log in as roles of their own, GRANTed one of
--   these. Neither the worker nor the approver may delete effects: purge is
--   the owner's (a retention job).
-- * A trigger on the effects table refuses, with SQLSTATE 42501, any status
--   change the engine does not make on its own (the worker's edges below)
--   unless the current role is a member of the approver role; the decider
--   it records is the database's identity of the session, never the
--   client's `decided_by`. Its WHEN clause lets every step of a run's hot
--   path (begin, claim, heartbeat, commit, release) through without calling
--   the function.
-- * With separation of duty on (the settings row), it also refuses a
--   decision by the identity that asked for the approval: the approvals
--   row's `requested_by`, which a second trigger always stamps with the
--   identity of the session that writes it.

-- ---------------------------------------------------------------------------
-- The roles (cluster-wide: created once, shared by every schema that uses them)
-- ---------------------------------------------------------------------------
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {owner_name}) THEN
        BEGIN
            CREATE ROLE {owner} NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another installer made it meanwhile
        END;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {worker_name}) THEN
        BEGIN
            CREATE ROLE {worker} NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {approver_name}) THEN
        BEGIN
            CREATE ROLE {approver} NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$roles$;

-- ---------------------------------------------------------------------------
-- The settings: which roles this schema's triggers trust, and whether a
-- requester may decide its own request. One row.
-- ---------------------------------------------------------------------------
CREATE TABLE IF NOT EXISTS {settings} (
    one            boolean     PRIMARY KEY DEFAULT true CHECK (one),
    owner_role     text        NOT NULL,
    worker_role    text        NOT NULL,
    approver_role  text        NOT NULL,
    -- On: the database refuses a decision by the identity that asked for it.
    separate_duty  boolean     NOT NULL DEFAULT false,
    installed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The functions below run as the caller (so current_user is the caller) with
-- a fixed search_path: a caller's own function named like a built-in one
-- (pg_has_role) in a schema it put first must not answer for it.
-- ---------------------------------------------------------------------------
-- Who the session is: the current role, or, when that is one of the three
-- group roles (a session that ran SET ROLE to one), the role it logged in as.
-- A login role with SET ROLE to a person's own role (granted WITH SET) is how
-- one service connection decides as several people, verified by PostgreSQL.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION {identity}() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $identity$
    SELECT CASE WHEN current_user IN ({owner_name}, {worker_name}, {approver_name})
                THEN session_user ELSE current_user END::text
$identity$;

-- ---------------------------------------------------------------------------
-- A new round of asking: an effect that enters requires_approval by an
-- update (a park of a silent attempt, an approval taken back) or is inserted
-- as a park has its request recorded here, with the session as the asker
-- (the requester trigger below stamps it whatever this writes), so
-- separation of duty applies to parks as to any other request. The round's
-- deadline, policy version and escalation start empty: the engine records
-- the new round's own after this (an earlier round's past deadline must not
-- let anyone deny the new one).
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION {record_request}(key text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $record_request$
    INSERT INTO {approvals} AS a (idem_key, requested_by)
    VALUES (key, {identity}())
    ON CONFLICT (idem_key) DO UPDATE
        SET requested_by = excluded.requested_by, policy_version = NULL, deadline_at = NULL,
            escalated_at = NULL, created_at = clock_timestamp()
$record_request$;

-- ---------------------------------------------------------------------------
-- Is NEW.history OLD.history with entries appended (nothing rewritten,
-- removed or reordered)?
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION {appended}(old_history jsonb, new_history jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $appended$
    SELECT old_history IS NOT DISTINCT FROM new_history
        OR (jsonb_typeof(old_history) = 'array' AND jsonb_typeof(new_history) = 'array'
            AND jsonb_array_length(new_history) >= jsonb_array_length(old_history)
            AND old_history = (SELECT coalesce(jsonb_agg(h.value ORDER BY h.n), '[]'::jsonb)
                               FROM jsonb_array_elements(new_history) WITH ORDINALITY AS h(value, n)
                               WHERE h.n <= jsonb_array_length(old_history)))
$appended$;

-- ---------------------------------------------------------------------------
-- The decision guard, BEFORE UPDATE of an effect's status, decision or
-- receipt (note, error, history).
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION {guard}() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $guard$
DECLARE
    settings record;
    who text := {identity}();
    expired_denial boolean;
    asker text;
    last jsonb;
BEGIN
    IF NEW.status = 'requires_approval' AND OLD.status IS DISTINCT FROM 'requires_approval' THEN
        PERFORM {record_request}(OLD.idem_key);
    END IF;
    IF OLD.status <> 'processing'
       AND ((NEW.decision_note IS DISTINCT FROM OLD.decision_note
             AND NEW.decided_at IS NOT DISTINCT FROM OLD.decided_at)
            OR (OLD.status = 'denied' AND NEW.error IS DISTINCT FROM OLD.error)
            OR NOT {appended}(OLD.history, NEW.history)) THEN
        -- A receipt is written once: why it was decided (the note, written
        -- only with a decision's decided_at), why it was denied (the error),
        -- what happened (the history, only ever appended to). Only an
        -- approver (or the owner) changes them otherwise.
        SELECT * INTO settings FROM {settings};
        IF settings IS NULL
           OR NOT (coalesce(pg_has_role(current_user, settings.approver_role, 'MEMBER'), false)
                   OR coalesce(pg_has_role(current_user, settings.owner_role, 'MEMBER'), false)) THEN
            RAISE EXCEPTION 'agent-ledger: % may not rewrite the receipt of effect % (%): its decision note, a denial''s error and its history (other than appending to it) are an approver''s',
                    who, OLD.idem_key, OLD.tool
                USING ERRCODE = '42501', CONSTRAINT = 'not_an_approver';
        END IF;
    END IF;
    IF NEW.status IS NOT DISTINCT FROM OLD.status
       AND NEW.decided_by IS NOT DISTINCT FROM OLD.decided_by
       AND NEW.decided_at IS NOT DISTINCT FROM OLD.decided_at THEN
        RETURN NEW;  -- nothing decided
    END IF;
    IF NEW.status IS NOT DISTINCT FROM OLD.status THEN
        -- Only the decision columns changed: a decision is recorded with its
        -- status change, never rewritten after it.
        RAISE EXCEPTION 'agent-ledger: % may not rewrite who decided effect % (%): a decision is recorded only with its status change',
                who, OLD.idem_key, OLD.tool
            USING ERRCODE = '42501', CONSTRAINT = 'not_an_approver';
    END IF;
    IF OLD.status = 'processing'
       OR (OLD.status = 'ready' AND NEW.status IN ('processing', 'requires_approval', 'canceled'))
       OR (OLD.status = 'requires_approval' AND NEW.status = 'canceled')
       OR (OLD.status = 'failed' AND NEW.status = 'processing') THEN
        -- One of the worker's own edges: a claim of an approved effect keeps
        -- its decider; only a cancel records a decision (its decider is the
        -- session's identity). Any other edge that writes or erases a
        -- decision would make an unapproved effect look approved (an honest
        -- gated run runs only an effect that carries a decision).
        IF NEW.decided_by IS DISTINCT FROM OLD.decided_by
           OR NEW.decided_at IS DISTINCT FROM OLD.decided_at THEN
            IF NEW.status <> 'canceled' THEN
                RAISE EXCEPTION 'agent-ledger: % may not record or erase a decision of effect % (%) while moving it from % to %',
                        who, OLD.idem_key, OLD.tool, OLD.status, NEW.status
                    USING ERRCODE = '42501', CONSTRAINT = 'not_an_approver';
            END IF;
            IF NEW.decided_by IS NOT NULL THEN
                NEW.decided_by := who;
            END IF;
        END IF;
        RETURN NEW;
    END IF;
    SELECT * INTO settings FROM {settings};
    -- Silence is never consent: anyone may deny an approval whose deadline passed.
    expired_denial := OLD.status = 'requires_approval' AND NEW.status = 'denied'
        AND EXISTS (SELECT 1 FROM {approvals} AS a
                    WHERE a.idem_key = OLD.idem_key AND a.deadline_at <= clock_timestamp());
    IF NOT expired_denial THEN
        IF settings IS NULL
           OR NOT coalesce(pg_has_role(current_user, settings.approver_role, 'MEMBER'), false) THEN
            RAISE EXCEPTION 'agent-ledger: % is not an approver: it may not move effect % (%) from % to % (only members of role % decide)',
                    who, OLD.idem_key, OLD.tool, OLD.status, NEW.status,
                    coalesce(settings.approver_role, {approver_name})
                USING ERRCODE = '42501', CONSTRAINT = 'not_an_approver',
                      HINT = format('GRANT %I TO %I; (as a role that may grant it)',
                                    coalesce(settings.approver_role, {approver_name}), who);
        END IF;
        IF settings.separate_duty THEN
            SELECT a.requested_by INTO asker FROM {approvals} AS a WHERE a.idem_key = OLD.idem_key;
            -- The asker is compared with every name this session acts under,
            -- as the application compares principals (case-insensitively): the
            -- identity above, the role it logged in as, and the current role
            -- (a member that ran SET ROLE to a group role of its own, granted
            -- the approver role, is still the person who asked).
            IF lower(asker) IN (lower(who), lower(session_user::text), lower(current_user::text)) THEN
                RAISE EXCEPTION 'agent-ledger: % asked for the approval of effect % (%) and may not decide it (separation of duty)',
                        who, OLD.idem_key, OLD.tool
                    USING ERRCODE = '42501', CONSTRAINT = 'self_decision',
                          HINT = 'another member of the approver role must decide it';
            END IF;
            -- Nobody recorded as the asker could be the decider: refused, but
            -- for a parked attempt (the system asked, when a worker went silent).
            IF asker IS NULL AND OLD.error ->> 'code' IS DISTINCT FROM 'ambiguous_attempt' THEN
                RAISE EXCEPTION 'agent-ledger: nobody is recorded as having asked for the approval of effect % (%): with separation of duty, a decision needs a recorded requester other than the decider',
                        OLD.idem_key, OLD.tool
                    USING ERRCODE = '42501', CONSTRAINT = 'unknown_requester',
                          HINT = 'the worker records the request (agent_ledger_approvals) when it asks for the approval';
            END IF;
        END IF;
    END IF;
    -- The decider is the session's identity, whatever the client wrote; the
    -- history's newest entry (the one this decision appended) says the same,
    -- and keeps a different name the client gave as `claimed_by`.
    IF NEW.decided_by IS DISTINCT FROM OLD.decided_by
       OR NEW.decided_at IS DISTINCT FROM OLD.decided_at THEN
        NEW.decided_by := who;
    END IF;
    IF jsonb_typeof(NEW.history) = 'array'
       AND jsonb_array_length(NEW.history) > jsonb_array_length(OLD.history) THEN
        last := NEW.history -> -1;
        IF jsonb_typeof(last) = 'object' AND last ? 'by' THEN
            IF last ->> 'by' IS DISTINCT FROM who AND last ->> 'by' IS NOT NULL THEN
                last := last || jsonb_build_object('claimed_by', last ->> 'by');
            END IF;
            NEW.history := jsonb_set(NEW.history, ARRAY[(jsonb_array_length(NEW.history) - 1)::text],
                                     last || jsonb_build_object('by', who));
        END IF;
    END IF;
    RETURN NEW;
END
$guard$;

-- The WHEN clause is the hot path's filter, and kept this short on purpose:
-- PostgreSQL compiles it once per statement, and a longer one (listing the
-- worker's edges) cost a commit some 40 microseconds of server time. A commit
-- or heartbeat (from processing, no decider) never calls the function; a
-- claim of a ready effect does, and the function lets the worker's edges
-- through at once.
CREATE OR REPLACE TRIGGER agent_ledger_effects_decision_guard
    BEFORE UPDATE OF status, decided_by, decided_at, decision_note, error, history ON {effects}
    FOR EACH ROW
    WHEN (OLD.status <> 'processing' OR NEW.status = 'requires_approval'
          OR OLD.decided_by IS DISTINCT FROM NEW.decided_by
          OR OLD.decided_at IS DISTINCT FROM NEW.decided_at)
    EXECUTE FUNCTION {guard}();

-- ---------------------------------------------------------------------------
-- New effects enter undecided: processing or requires_approval, with no
-- decider. The worker may not write an effect's decision columns at all
-- (its INSERT grant leaves them out, below), and this trigger refuses any
-- other first status to anyone but an approver or the owner (an import of
-- decided rows). Its WHEN is as short as it can be: a begin (processing)
-- never calls the function, and the clause itself costs each insert a few
-- microseconds where the full condition cost some 11.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION {insert_guard}() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $insert_guard$
DECLARE
    settings record;
BEGIN
    IF NEW.status IN ('processing', 'requires_approval')
       AND NEW.decided_by IS NULL AND NEW.decided_at IS NULL THEN
        -- An effect inserted as a parked attempt (the engine never makes
        -- one so: it parks a running one) has its asker recorded, as a park
        -- by update does: separation of duty exempts no unrecorded park.
        IF NEW.status = 'requires_approval' AND NEW.error ->> 'code' = 'ambiguous_attempt' THEN
            PERFORM {record_request}(NEW.idem_key);
        END IF;
        RETURN NEW;
    END IF;
    SELECT * INTO settings FROM {settings};
    IF settings IS NULL
       OR NOT (coalesce(pg_has_role(current_user, settings.approver_role, 'MEMBER'), false)
               OR coalesce(pg_has_role(current_user, settings.owner_role, 'MEMBER'), false)) THEN
        RAISE EXCEPTION 'agent-ledger: % may not insert effect % (%) as % or with a decider: new effects start as processing or requires_approval',
                {identity}(), NEW.idem_key, NEW.tool, NEW.status
            USING ERRCODE = '42501', CONSTRAINT = 'not_an_approver';
    END IF;
    RETURN NEW;
END
$insert_guard$;

CREATE OR REPLACE TRIGGER agent_ledger_effects_insert_guard
    BEFORE INSERT ON {effects}
    FOR EACH ROW
    WHEN (NEW.status <> 'processing')
    EXECUTE FUNCTION {insert_guard}();

-- ---------------------------------------------------------------------------
-- Who asked: always the identity of the session that writes the request.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION {stamp}() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $stamp$
BEGIN
    NEW.requested_by := {identity}();
    RETURN NEW;
END
$stamp$;

CREATE OR REPLACE TRIGGER agent_ledger_approvals_requester
    BEFORE INSERT ON {approvals}
    FOR EACH ROW
    EXECUTE FUNCTION {stamp}();

CREATE OR REPLACE TRIGGER agent_ledger_approvals_requester_changed
    BEFORE UPDATE OF requested_by ON {approvals}
    FOR EACH ROW
    WHEN (OLD.requested_by IS DISTINCT FROM NEW.requested_by)
    EXECUTE FUNCTION {stamp}();

-- ---------------------------------------------------------------------------
-- The partitioned variant's key table: a key row names its effect, and a
-- begin's insert of the same key meets it. Deleting the row of an effect
-- that exists would let a begin insert a second effect beside it (one that
-- never waited for the first one's approval), so only the owner (a purge)
-- may; anyone who may delete keys may delete a row whose effect is gone (a
-- begin reclaiming a key whose partition a purge detached).
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION {guard_key_delete}() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $guard_key_delete$
DECLARE
    settings record;
BEGIN
    IF EXISTS (SELECT 1 FROM {effects} AS e WHERE e.id = OLD.id AND e.created_at = OLD.created_at) THEN
        SELECT * INTO settings FROM {settings};
        IF settings IS NULL
           OR NOT coalesce(pg_has_role(current_user, settings.owner_role, 'MEMBER'), false) THEN
            RAISE EXCEPTION 'agent-ledger: % may not delete the key row of effect % while the effect exists (only the owner purges)',
                    {identity}(), OLD.idem_key
                USING ERRCODE = '42501', CONSTRAINT = 'not_the_owner';
        END IF;
    END IF;
    RETURN OLD;
END
$guard_key_delete$;

DO $keys$
BEGIN
    IF to_regclass({keys_name}) IS NOT NULL THEN
        CREATE OR REPLACE TRIGGER agent_ledger_effect_keys_delete_guard
            BEFORE DELETE ON {keys}
            FOR EACH ROW
            EXECUTE FUNCTION {guard_key_delete}();
    END IF;
END
$keys$;

-- ---------------------------------------------------------------------------
-- Ownership: every table, sequence and function of the ledger in this
-- schema belongs to the owner role (partitions included).
-- ---------------------------------------------------------------------------
DO $owner$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS name FROM pg_class AS c
             WHERE c.relnamespace = {schema_name}::regnamespace
               AND c.relkind IN ('r', 'p') AND c.relname LIKE 'agent\_ledger\_%'
    LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO %I', r.name, {owner_name});
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS name FROM pg_proc AS p
             WHERE p.pronamespace = {schema_name}::regnamespace
               AND p.proname LIKE 'agent\_ledger\_%'
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', r.name, {owner_name});
    END LOOP;
    -- A begin that finds no partition for now makes it (the partitioned
    -- variant): as the owner, who alone may attach partitions.
    IF to_regprocedure({add_partitions_name}) IS NOT NULL THEN
        -- A definer's search_path names the schema and puts pg_temp last, so
        -- no caller's temporary table stands in for the ledger's.
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                       to_regprocedure({add_partitions_name}), {schema_name});
        -- Only the worker (a begin) calls it, besides its owner; and for a
        -- caller that is not a member of the owner it makes partitions only
        -- from the previous period to `ahead` periods on
        -- (postgres_partitioned.sql).
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC',
                       to_regprocedure({add_partitions_name}));
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I',
                       to_regprocedure({add_partitions_name}), {worker_name});
    END IF;
END
$owner$;

-- ---------------------------------------------------------------------------
-- Grants. Re-running grants again (GRANT is idempotent). Only the ledger's
-- own objects (agent_ledger_*): the schema may hold the application's
-- tables too. Column lists are not used: the triggers guard what a column
-- list could not (which transitions), and a later version's new column
-- must not need a grant of its own.
-- ---------------------------------------------------------------------------
GRANT USAGE, CREATE ON SCHEMA {schema} TO {owner};
GRANT USAGE ON SCHEMA {schema} TO {worker}, {approver};

DO $grants$
DECLARE
    r record;
    columns text;
BEGIN
    -- Everyone reads the ledger (partitions are read through their parent).
    FOR r IN SELECT c.oid::regclass AS name, c.relkind FROM pg_class AS c
             WHERE c.relnamespace = {schema_name}::regnamespace
               AND c.relkind IN ('r', 'p', 'S') AND NOT c.relispartition
               AND c.relname LIKE 'agent\_ledger\_%'
    LOOP
        IF r.relkind = 'S' THEN
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO %I', r.name, {approver_name});
        ELSE
            EXECUTE format('GRANT SELECT ON %s TO %I, %I', r.name, {worker_name}, {approver_name});
        END IF;
    END LOOP;
    -- The worker inserts effects, every column but the decision's.
    EXECUTE format('REVOKE INSERT ON %s FROM %I', {effects_name}::regclass, {worker_name});
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO columns
    FROM pg_attribute AS a
    WHERE a.attrelid = {effects_name}::regclass AND a.attnum > 0 AND NOT a.attisdropped
      AND a.attname NOT IN ('decided_by', 'decided_at', 'decision_note');
    EXECUTE format('GRANT INSERT (%s) ON %s TO %I', columns, {effects_name}::regclass,
                   {worker_name});
    -- Both update effects, but never what identifies one and what runs (its
    -- key, workflow, tool, arguments): an approved effect runs as shown.
    EXECUTE format('REVOKE UPDATE ON %s FROM %I, %I', {effects_name}::regclass, {worker_name},
                   {approver_name});
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO columns
    FROM pg_attribute AS a
    WHERE a.attrelid = {effects_name}::regclass AND a.attnum > 0 AND NOT a.attisdropped
      AND a.attname NOT IN ('id', 'idem_key', 'workflow_id', 'call_id', 'tool',
                            'args_canonical', 'resource_id_canonical', 'created_at');
    EXECUTE format('GRANT UPDATE (%s) ON %s TO %I, %I', columns, {effects_name}::regclass,
                   {worker_name}, {approver_name});
    -- The partitioned variant's key table: begin inserts a key, and removes
    -- one whose effect is gone.
    IF to_regclass({keys_name}) IS NOT NULL THEN
        EXECUTE format('GRANT INSERT, DELETE ON %s TO %I', to_regclass({keys_name}), {worker_name});
    END IF;
END
$grants$;

-- The worker: effects (never a delete: purge is the owner's), the engine's
-- own tables, approval requests.
GRANT INSERT, UPDATE, DELETE ON {budgets}, {holds}, {charges} TO {worker};
GRANT INSERT, UPDATE ON {sagas}, {steps} TO {worker};
-- Requests: never their key (a request moved to another effect would leave
-- its own with no requester), only what a renewed request rewrites.
REVOKE UPDATE ON {approvals} FROM {worker}, {approver};
GRANT INSERT ON {approvals} TO {worker};
GRANT UPDATE (requested_by, policy_version, deadline_at, escalated_at, created_at)
    ON {approvals} TO {worker};

-- The approver: decisions, their audit trail, signed links; and marks on
-- requests (escalation).
GRANT INSERT ON {attempts}, {links} TO {approver};
GRANT UPDATE (escalated_at) ON {approvals} TO {approver};
-- An approver that takes an approval back (ready -> requires_approval) asks
-- anew: the decision guard records the new round's request as its own.
GRANT INSERT ON {approvals} TO {approver};
GRANT UPDATE (requested_by, policy_version, deadline_at, escalated_at, created_at)
    ON {approvals} TO {approver};
