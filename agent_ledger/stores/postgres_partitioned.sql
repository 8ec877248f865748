-- agent-ledger PostgreSQL: the effects table partitioned by time (opt-in).
--
-- Not a schema version: a variant of any version from 3 on, chosen once per
-- schema with `agent-ledger init --partitioned` (or
-- `PostgresStore(..., partitioned=True).create_schema()`), which applies
-- postgres_schema.sql first and then this file; or, for a ledger that
-- already holds effects, by the conversion `SELECT
-- agent_ledger_partition_effects('month')` (docs/postgres.md, "A hundred
-- million effects"). The variant is recorded in the schema itself: the row of
-- `agent_ledger_effect_partitioning`, and `agent_ledger_effects` being a
-- partitioned table (pg_class.relkind 'p'). A later version's section of
-- postgres_schema.sql runs against the partitioned table unchanged: ALTER
-- TABLE ... ADD COLUMN and CREATE INDEX reach every partition.
--
-- The design (each part says why):
--
-- * `agent_ledger_effects` is partitioned by RANGE (created_at), one partition
--   per day, week or month (UTC), named agent_ledger_effects_pYYYYMMDD after
--   its first day. There is no DEFAULT partition: PostgreSQL cannot detach
--   a partition CONCURRENTLY beside one. An insert that finds no partition
--   (a clock far ahead, maintenance that lagged) fails, and PostgresStore.begin
--   then runs agent_ledger_add_partitions() and tries again. Its primary key is
--   (id, created_at): PostgreSQL requires the partition key in every unique
--   index of a partitioned table.
-- * So no index of it can make idem_key unique across partitions, and
--   `agent_ledger_effect_keys` does: one row per key of an effect that exists,
--   with that effect's primary key (id, created_at). begin inserts the key and the effect in one
--   statement (ON CONFLICT on the key table's primary key: one index probe);
--   nothing else writes the table but purge. A read by key (a replay) takes
--   the partition from the key row, so it probes one partition's index; the
--   effects table keeps a plain index on idem_key (per partition) for the
--   other statements by key.
-- * postgres_schema.sql's version 1 creates a UNIQUE index on idem_key,
--   which PostgreSQL refuses on a partitioned table even when IF NOT EXISTS
--   would skip it: PostgresStore applies that file without that one
--   statement to a partitioned schema (`migrate()`, `agent-ledger migrate`;
--   applying it with psql fails there). A later version's section must not
--   create a unique index on agent_ledger_effects without created_at.
-- * Retention: purge detaches (CONCURRENTLY: no lock that stops writers) and
--   drops every partition wholly older than the cut-off whose every row it
--   would delete, deletes those effects' key rows in batches, and deletes
--   row by row only in the other partitions that reach back past the
--   cut-off (the boundary one, one holding a saga step or
--   an old approval still pending).
-- * Partitions are made ahead of time by agent_ledger_add_partitions(): init
--   and conversion make the current one and `ahead` more (3 by default),
--   and every purge tops them up, so a ledger purged at least once per
--   `ahead` periods never meets a missing partition.

-- ---------------------------------------------------------------------------
-- The variant's record: how long a partition is, how many are made ahead.
-- ---------------------------------------------------------------------------
CREATE TABLE IF NOT EXISTS agent_ledger_effect_partitioning (
    one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
    period      text        NOT NULL CHECK (period IN ('day', 'week', 'month')),
    ahead       integer     NOT NULL DEFAULT 3 CHECK (ahead BETWEEN 1 AND 366),
    -- When the table was partitioned, and the boundary its old rows were kept
    -- below (the "legacy" partition of a conversion; NULL: there were none).
    converted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    legacy_until  timestamptz
);

-- ---------------------------------------------------------------------------
-- The partitions as they stand: name and bounds, from the catalogue.
-- A partition from MINVALUE (a conversion's legacy one) has lo NULL.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION agent_ledger_effect_partitions()
RETURNS TABLE (name text, lo timestamptz, hi timestamptz)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT c.relname::text,
           CASE WHEN b.m[1] <> 'MINVALUE' THEN trim(both '''' from b.m[1])::timestamptz END,
           trim(both '''' from b.m[2])::timestamptz
    FROM pg_inherits AS i
    JOIN pg_class AS c ON c.oid = i.inhrelid
    LEFT JOIN LATERAL (
        SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid),
                            '^FOR VALUES FROM \((.*)\) TO \((.*)\)$') AS m
    ) AS b ON true
    WHERE i.inhparent = 'agent_ledger_effects'::regclass
    ORDER BY 3 NULLS LAST
$$;

-- ---------------------------------------------------------------------------
-- Partitions up to `upto`: every period from the current one (or the one
-- holding `since`, to make partitions for the past) to the one
-- holding `upto` that no partition covers yet gets one (a gap too: a period
-- partly covered, after a change of period, is left as it is). Each is made
-- as a plain table and attached: ATTACH takes only a SHARE
-- UPDATE EXCLUSIVE lock on the parent, which writers do not wait for
-- (CREATE TABLE ... PARTITION OF would take an ACCESS EXCLUSIVE one).
-- Returns how many it made. Safe to run while the ledger runs.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION agent_ledger_add_partitions(upto timestamptz DEFAULT NULL,
                                                       since timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    unit text;
    step interval;
    lo_at timestamptz;
    hi_at timestamptz;
    made integer := 0;
    part text;
BEGIN
    SELECT p.period, CASE p.period WHEN 'day' THEN interval '1 day'
                                  WHEN 'week' THEN interval '7 days'
                                  ELSE interval '1 month' END,
           coalesce(upto, clock_timestamp() + p.ahead * CASE p.period
               WHEN 'day' THEN interval '1 day' WHEN 'week' THEN interval '7 days'
               ELSE interval '1 month' END)
      INTO unit, step, upto
      FROM agent_ledger_effect_partitioning AS p;
    IF unit IS NULL THEN
        RAISE EXCEPTION 'agent_ledger_effects is not partitioned here (no agent_ledger_effect_partitioning row)';
    END IF;
    -- Under the role set this runs as its owner (SECURITY DEFINER) for a
    -- worker's begin, which needs only the current period: a caller that is
    -- not a member of the owner gets partitions from the previous period to
    -- `ahead` periods on, never an unbounded number of tables.
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND (upto > clock_timestamp() + (SELECT p.ahead FROM agent_ledger_effect_partitioning AS p) * step
            OR since < clock_timestamp() - step) THEN
        RAISE EXCEPTION 'agent_ledger_add_partitions: % may make partitions only from % to % (the previous period to `ahead` periods on); the owner makes others',
                session_user, clock_timestamp() - step,
                clock_timestamp() + (SELECT p.ahead FROM agent_ledger_effect_partitioning AS p) * step
            USING ERRCODE = '42501';
    END IF;
    -- One maker at a time (two would race to attach the same range).
    PERFORM pg_advisory_xact_lock(hashtext('agent_ledger_add_partitions'));
    lo_at := date_trunc(unit, coalesce(since, clock_timestamp()), 'UTC');
    WHILE lo_at <= upto LOOP
        -- Calendar steps in UTC, whatever the session's TimeZone.
        hi_at := ((lo_at AT TIME ZONE 'UTC') + step) AT TIME ZONE 'UTC';
        IF EXISTS (SELECT 1 FROM agent_ledger_effect_partitions() AS b
                   WHERE coalesce(b.lo, '-infinity') < hi_at AND b.hi > lo_at) THEN
            lo_at := hi_at;
            CONTINUE;
        END IF;
        part := 'agent_ledger_effects_p' || to_char(lo_at AT TIME ZONE 'UTC', 'YYYYMMDD');
        EXECUTE format('CREATE TABLE %I (LIKE agent_ledger_effects'
                       ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
        -- A matching CHECK lets ATTACH skip its scan of the new table.
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (created_at >= %L AND created_at < %L)',
                       part, part || '_range', lo_at, hi_at);
        EXECUTE format('ALTER TABLE agent_ledger_effects ATTACH PARTITION %I'
                       ' FOR VALUES FROM (%L) TO (%L)', part, lo_at, hi_at);
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', part, part || '_range');
        made := made + 1;
        lo_at := hi_at;
    END LOOP;
    RETURN made;
END
$$;

-- ---------------------------------------------------------------------------
-- Partition agent_ledger_effects (`period`: 'day', 'week' or 'month').
-- Run by init --partitioned on a new schema, and by hand to convert a
-- ledger that holds effects (docs/postgres.md says when and how long it
-- takes). One transaction; it takes an ACCESS EXCLUSIVE lock on the effects
-- table, so writers wait for it. What it does:
--   1. renames the table to agent_ledger_effects_legacy (its indexes get a
--      _legacy suffix; its primary key, on id alone, and its notify trigger
--      go: the new table's take their place);
--   2. creates the partitioned agent_ledger_effects with the same columns,
--      constraints, indexes (idem_key's not unique) and trigger;
--   3. fills agent_ledger_effect_keys from the old rows, and attaches the
--      old table as the partition of everything before the next period
--      boundary (an empty one is dropped instead);
--   4. makes the partitions ahead.
-- Returns what it found ('partitioned', or 'already partitioned').
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION agent_ledger_partition_effects(period text DEFAULT 'month',
                                                          ahead integer DEFAULT 3)
RETURNS text
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    kind "char";
    unit text := period;
    boundary timestamptz;
    idx record;
    has_rows boolean;
BEGIN
    IF unit IS NULL OR unit NOT IN ('day', 'week', 'month') THEN
        RAISE EXCEPTION 'period must be day, week or month, got %', coalesce(unit, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ahead IS NULL OR ahead < 1 OR ahead > 366 THEN
        RAISE EXCEPTION 'ahead must be 1 to 366 periods, got %', coalesce(ahead::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.relkind INTO kind FROM pg_class AS c WHERE c.oid = 'agent_ledger_effects'::regclass;
    IF kind = 'p' THEN
        RETURN 'already partitioned';
    END IF;
    LOCK TABLE agent_ledger_effects IN ACCESS EXCLUSIVE MODE;

    -- 1. The old table steps aside.
    ALTER TABLE agent_ledger_effects RENAME TO agent_ledger_effects_legacy;
    FOR idx IN
        SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'agent_ledger_effects_legacy'::regclass
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', idx.relname, idx.relname || '_legacy');
    END LOOP;
    DROP TRIGGER agent_ledger_effects_notify ON agent_ledger_effects_legacy;
    -- A partition has the parent's primary key, (id, created_at), built on attach.
    ALTER TABLE agent_ledger_effects_legacy DROP CONSTRAINT agent_ledger_effects_pkey_legacy;

    -- 2. The partitioned table: the same columns, defaults and CHECKs.
    CREATE TABLE agent_ledger_effects (
        LIKE agent_ledger_effects_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
        PRIMARY KEY (id, created_at)
    ) PARTITION BY RANGE (created_at);
    -- postgres_schema.sql's indexes, by the same names (so its IF NOT EXISTS
    -- finds them), but idem_key's cannot be unique here: the key table is.
    CREATE INDEX agent_ledger_effects_idem_key_idx ON agent_ledger_effects (idem_key);
    CREATE INDEX agent_ledger_effects_created_idx
        ON agent_ledger_effects (created_at DESC, id DESC);
    CREATE INDEX agent_ledger_effects_workflow_idx
        ON agent_ledger_effects (workflow_id, created_at DESC);
    CREATE INDEX agent_ledger_effects_open_idx
        ON agent_ledger_effects (status, heartbeat_at)
        WHERE status IN ('processing', 'requires_approval', 'ready');
    CREATE TRIGGER agent_ledger_effects_notify
        AFTER UPDATE OF status ON agent_ledger_effects
        FOR EACH ROW
        WHEN (OLD.status IS DISTINCT FROM NEW.status
              AND (NEW.dedup_count > 0
                   OR OLD.status <> 'processing'
                   OR NEW.status NOT IN ('succeeded', 'failed')))
        EXECUTE FUNCTION agent_ledger_notify_change();
    CREATE TABLE agent_ledger_effect_keys (
        idem_key    text         PRIMARY KEY,
        -- The effect's primary key (agent_ledger_effects.id, created_at): a
        -- read by key finds its partition here, and probes only that one.
        id          uuid         NOT NULL,
        created_at  timestamptz  NOT NULL
    );
    INSERT INTO agent_ledger_effect_partitioning (period, ahead) VALUES (unit, ahead);

    -- 3. The old rows: their keys, and the old table as one partition.
    SELECT EXISTS (SELECT 1 FROM agent_ledger_effects_legacy) INTO has_rows;
    IF has_rows THEN
        INSERT INTO agent_ledger_effect_keys (idem_key, id, created_at)
            SELECT idem_key, id, created_at FROM agent_ledger_effects_legacy;
        SELECT date_trunc(unit, greatest(clock_timestamp(), max(created_at)), 'UTC')
            INTO boundary FROM agent_ledger_effects_legacy;
        boundary := ((boundary AT TIME ZONE 'UTC') + CASE unit WHEN 'day' THEN interval '1 day'
            WHEN 'week' THEN interval '7 days' ELSE interval '1 month' END) AT TIME ZONE 'UTC';
        EXECUTE format('ALTER TABLE agent_ledger_effects_legacy ADD CONSTRAINT'
                       ' agent_ledger_effects_legacy_range CHECK (created_at < %L)', boundary);
        EXECUTE format('ALTER TABLE agent_ledger_effects ATTACH PARTITION'
                       ' agent_ledger_effects_legacy FOR VALUES FROM (MINVALUE) TO (%L)', boundary);
        ALTER TABLE agent_ledger_effects_legacy DROP CONSTRAINT agent_ledger_effects_legacy_range;
        UPDATE agent_ledger_effect_partitioning SET legacy_until = boundary;
    ELSE
        DROP TABLE agent_ledger_effects_legacy;
    END IF;

    -- 4. The partitions ahead.
    PERFORM agent_ledger_add_partitions();
    RETURN 'partitioned';
END
$$;
