-- Issue 27: the outbox in rows (0020_outbox_rows.sql; docs/explanation/outbox-rows.md) kept
-- in id ranges, as today's outbox is (0015_rotate.sql; docs/explanation/architecture.md,
-- "History in id ranges"). slawatch.outbox_row becomes partitioned by its id and
-- slawatch.outbox_send by its row_id, and each range of slawatch.history_range holds,
-- beside its alert ids [low, high), the row ids [row_low, row_high): the partitions
-- outbox_row_h<n> and outbox_send_h<n>. The same rotation opens both (history_rotate
-- moves both id sequences), and the same drop takes both (history_drop): a range goes
-- whole once it was closed before the window and holds no pending delivery, no pending
-- send and no alert acked within the window. A range that must be kept is pruned row by
-- row (queries.sql, prune_outbox_rows, one range at a time).
--
-- A range opened before this migration holds no rows (row_low NULL). The open range
-- takes every row written so far: [0, the next multiple of 2^25 above the rows' id
-- sequence; history_rows_open). A database whose outbox is not converted into ranges
-- yet (a fresh one: no range recorded) gets the rows' range with its open range
-- (history_convert_all, slawatch/engine/rotate.py), before any row can be written.
--
-- The tables are converted in this one transaction, their rows copied: they are a
-- preview, empty unless SLAWATCH_OUTBOX=rows wrote to them, and one row holds 100 alerts,
-- so a window's worth is small (a million alerts are 10,000 rows). The ACCESS
-- EXCLUSIVE lock holds the rows' claims and delivery back for the copy's length.

ALTER TABLE slawatch.history_range ADD COLUMN row_low bigint, ADD COLUMN row_high bigint,
    ADD CONSTRAINT history_range_rows CHECK ((row_low IS NULL) = (row_high IS NULL)
                                              AND (row_low IS NULL OR row_low < row_high));

LOCK TABLE slawatch.outbox_row, slawatch.outbox_send IN ACCESS EXCLUSIVE MODE;
CREATE TEMPORARY TABLE outbox_row_copy ON COMMIT DROP AS SELECT * FROM slawatch.outbox_row;
CREATE TEMPORARY TABLE outbox_send_copy ON COMMIT DROP AS SELECT * FROM slawatch.outbox_send;
-- The tables' grants (beside their owner's) and the row id sequence's position.
CREATE TEMPORARY TABLE outbox_kept ON COMMIT DROP AS
SELECT c.relname::text AS relname,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
           AS who,
       a.privilege_type, a.is_grantable
  FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
 WHERE c.oid IN ('slawatch.outbox_row'::regclass, 'slawatch.outbox_send'::regclass)
   AND a.grantee <> c.relowner;
CREATE TEMPORARY TABLE outbox_seq ON COMMIT DROP AS
SELECT pg_sequence_last_value(pg_get_serial_sequence('slawatch.outbox_row', 'id')::regclass)
    AS last;
DROP TABLE slawatch.outbox_row, slawatch.outbox_send;

-- As 0020, 0022 and 0023 left them, partitioned: the same columns in the same order,
-- the same constraints and indexes by the same names. The storage parameters
-- (outbox_send's fillfactor) go on each partition: a partitioned table takes none.
CREATE TABLE slawatch.outbox_row (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('firing', 'resolved')),
    fired_at timestamptz NOT NULL,
    after interval,
    notifiers text[] NOT NULL,
    keys text[] NOT NULL,
    episodes integer[] NOT NULL,
    ns integer[] NOT NULL,
    severities text[] NOT NULL,
    deadlines timestamptz[] NOT NULL,
    row_data jsonb[] NOT NULL,
    due_ats timestamptz[],
    CHECK (cardinality(keys) BETWEEN 1 AND 100
           AND cardinality(episodes) = cardinality(keys) AND cardinality(ns) = cardinality(keys)
           AND cardinality(severities) = cardinality(keys)
           AND cardinality(deadlines) = cardinality(keys)
           AND cardinality(row_data) = cardinality(keys)),
    CONSTRAINT outbox_row_due CHECK (
        (after IS NOT NULL OR due_ats IS NOT NULL)
        AND (due_ats IS NULL OR cardinality(due_ats) = cardinality(keys)))
) PARTITION BY RANGE (id);
CREATE INDEX outbox_row_fired ON slawatch.outbox_row (rule, fired_at);

CREATE TABLE slawatch.outbox_send (
    row_id bigint NOT NULL,
    notifier text NOT NULL,
    status text NOT NULL DEFAULT 'pending'
        CONSTRAINT outbox_send_status_check
        CHECK (status IN ('pending', 'sent', 'dead', 'orphaned', 'summarized')),
    attempts integer NOT NULL DEFAULT 0,
    done integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    lease_owner uuid,
    lease_expires_at timestamptz,
    last_error text,
    sent_at timestamptz,
    skipped text[],
    summary_id bigint,
    PRIMARY KEY (row_id, notifier)
) PARTITION BY RANGE (row_id);
CREATE INDEX outbox_send_due ON slawatch.outbox_send (notifier, next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX outbox_send_dead ON slawatch.outbox_send (notifier)
    WHERE status IN ('dead', 'orphaned');
CREATE INDEX outbox_send_summary ON slawatch.outbox_send (summary_id, row_id)
    WHERE summary_id IS NOT NULL;

-- The rows' data compresses with lz4 where the server has it (0020_outbox_rows.sql); the
-- partitions take the parent's compression.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings
                WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE slawatch.outbox_row ALTER COLUMN row_data SET COMPRESSION lz4;
    END IF;
END
$$;

-- The partitions of range n's rows, [low, high), made empty in one transaction.
CREATE FUNCTION slawatch.history_open_rows(n integer, low bigint, high bigint)
    RETURNS void LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('CREATE TABLE slawatch.%I PARTITION OF slawatch.outbox_row'
                   ' FOR VALUES FROM (%s) TO (%s)', 'outbox_row_h' || n, low, high);
    -- fillfactor 70: room for a send's leased versions, a HOT update (0020_outbox_rows.sql).
    EXECUTE format('CREATE TABLE slawatch.%I PARTITION OF slawatch.outbox_send'
                   ' FOR VALUES FROM (%s) TO (%s) WITH (fillfactor = 70)',
                   'outbox_send_h' || n, low, high);
    UPDATE slawatch.history_range r
       SET row_low = history_open_rows.low, row_high = history_open_rows.high
     WHERE r.n = history_open_rows.n;
END
$$;

-- The open range (the newest) takes the rows from here when it holds none yet: from
-- the newest range's rows on (0 when none holds any) to the next multiple of 2^25
-- above the rows' id sequence, which is moved into it. Nothing when no range is
-- recorded (the outbox is not converted yet: its conversion calls this again).
-- 2^25 row ids a range (33 million rows, 3.3 billion alerts) where an alert range
-- has 2^32 ids: an element's id, -(row id * 128 + place), then grows by 2^32 a
-- range, as an alert's does.
CREATE FUNCTION slawatch.history_rows_open() RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cur slawatch.history_range;
    seq regclass := pg_get_serial_sequence('slawatch.outbox_row', 'id')::regclass;
    first bigint;
    drawn bigint;
BEGIN
    SELECT * INTO cur FROM slawatch.history_range r ORDER BY r.n DESC LIMIT 1;
    IF NOT FOUND OR cur.row_low IS NOT NULL THEN
        RETURN NULL;
    END IF;
    first := coalesce((SELECT max(r.row_high) FROM slawatch.history_range r), 0);
    drawn := coalesce(pg_sequence_last_value(seq), 0);
    PERFORM slawatch.history_open_rows(cur.n, first,
                                       (greatest(first, drawn) / 33554432 + 1) * 33554432);
    IF drawn < first THEN
        PERFORM setval(seq, first, false);
    END IF;
    RETURN cur.n;
END
$$;

-- The rows written so far go to the open range (none before the outbox's conversion).
DO $$
BEGIN
    PERFORM slawatch.history_rows_open();
END
$$;
INSERT INTO slawatch.outbox_row (id, rule, kind, fired_at, after, notifiers, keys, episodes,
                                 ns, severities, deadlines, row_data, due_ats)
OVERRIDING SYSTEM VALUE
SELECT id, rule, kind, fired_at, after, notifiers, keys, episodes, ns, severities, deadlines,
       row_data, due_ats
  FROM outbox_row_copy;
INSERT INTO slawatch.outbox_send (row_id, notifier, status, attempts, done, next_attempt_at,
                                  lease_owner, lease_expires_at, last_error, sent_at, skipped,
                                  summary_id)
SELECT row_id, notifier, status, attempts, done, next_attempt_at, lease_owner,
       lease_expires_at, last_error, sent_at, skipped, summary_id
  FROM outbox_send_copy;
DO $$
DECLARE
    g record;
BEGIN
    PERFORM setval(pg_get_serial_sequence('slawatch.outbox_row', 'id'), last)
       FROM outbox_seq WHERE last IS NOT NULL;
    FOR g IN SELECT * FROM outbox_kept LOOP
        EXECUTE format('GRANT %s ON slawatch.%I TO %s%s', g.privilege_type, g.relname, g.who,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

-- The rotation opens the next range's rows with its alerts, and moves the rows' id
-- sequence into them, last, as it moves the alerts'. A range is due to close when it
-- was opened `every` ago or half its alert ids or half its row ids are drawn. The
-- signature and result are 0016's: CREATE OR REPLACE keeps the grants.
CREATE OR REPLACE FUNCTION slawatch.history_rotate(now timestamptz, every interval)
    RETURNS integer LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET lock_timeout = '2s' AS $$
DECLARE
    cur slawatch.history_range;
    seq regclass;
    drawn bigint;
    row_seq regclass;
    rows_drawn bigint;
BEGIN
    IF to_regclass('slawatch.alert_rotating') IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM slawatch.history_convert WHERE swapped_at IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('slawatch.history_range', 0));
    SELECT * INTO cur FROM slawatch.history_range r ORDER BY r.n DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    seq := pg_get_serial_sequence('slawatch.alert', 'id')::regclass;
    drawn := coalesce(pg_sequence_last_value(seq), 0);
    row_seq := pg_get_serial_sequence('slawatch.outbox_row', 'id')::regclass;
    rows_drawn := coalesce(pg_sequence_last_value(row_seq), 0);
    IF cur.opened_at > now - every AND drawn < cur.low + (cur.high - cur.low) / 2
       AND (cur.row_low IS NULL
            OR rows_drawn < cur.row_low + (cur.row_high - cur.row_low) / 2) THEN
        RETURN NULL;
    END IF;
    -- A lock not granted within the lock_timeout (long transactions on the outbox) is
    -- an error: the retention job says so in one line and tries again at its next run.
    PERFORM slawatch.history_open(cur.n + 1, cur.high, cur.high + 4294967296, now);
    UPDATE slawatch.history_range r SET closed_at = now WHERE r.n = cur.n;
    IF cur.row_high IS NULL THEN
        PERFORM slawatch.history_rows_open();  -- the rows' first range
    ELSE
        PERFORM slawatch.history_open_rows(cur.n + 1, cur.row_high, cur.row_high + 33554432);
    END IF;
    IF drawn < cur.high THEN
        PERFORM setval(seq, cur.high, false);  -- last: not undone by a rollback
    END IF;
    IF cur.row_high IS NOT NULL AND rows_drawn < cur.row_high THEN
        PERFORM setval(row_seq, cur.row_high, false);
    END IF;
    RETURN cur.n + 1;
END
$$;

-- The drop (0019_history_drop_locked.sql) with the range's rows: a pending send keeps the
-- range as a pending delivery does; its row partitions are locked (before the alerts')
-- and looked at again, then dropped with the rest. An ack names an alert of a row by
-- (rule, key, episode) and keeps no row (queries.sql, prune_outbox_rows: as row by row).
-- The signature and result are 0016's (the rows are not counted): CREATE OR REPLACE
-- keeps the grants.
CREATE OR REPLACE FUNCTION slawatch.history_drop(cutoff timestamptz)
    RETURNS TABLE (n integer, alerts bigint, deliveries bigint, acks bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET lock_timeout = '2s' AS $$
DECLARE
    r slawatch.history_range;
    part text;
    kept boolean;
    locked boolean;
BEGIN
    IF to_regclass('slawatch.alert_rotating') IS NOT NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('slawatch.history_range', 0));
    FOR r IN SELECT * FROM slawatch.history_range h
              WHERE h.closed_at < cutoff ORDER BY h.n LOOP
        -- Pass 1 reads; a range that looks droppable gets its partitions locked and
        -- pass 2 reads again what committed meanwhile.
        locked := false;
        FOR pass IN 1..2 LOOP
            -- Kept: a delivery or a row's send still to send, or an alert acked within
            -- the window.
            kept := EXISTS (SELECT 1 FROM slawatch.delivery d
                             WHERE d.alert_id >= r.low AND d.alert_id < r.high
                               AND d.status = 'pending')
                 OR EXISTS (SELECT 1 FROM slawatch.outbox_send s
                             WHERE s.row_id >= r.row_low AND s.row_id < r.row_high
                               AND s.status = 'pending')
                 OR EXISTS (SELECT 1 FROM slawatch.ack k
                             WHERE k.acked_at >= cutoff
                               AND k.alert_id >= r.low AND k.alert_id < r.high);
            EXIT WHEN kept OR pass = 2;
            FOREACH part IN ARRAY ARRAY['outbox_send_h' || r.n, 'outbox_row_h' || r.n,
                                        'delivery_h' || r.n, 'alert_h' || r.n] LOOP
                IF to_regclass(format('slawatch.%I', part)) IS NOT NULL THEN
                    -- A lock not granted in time is an error: the call is undone and
                    -- the retention job's next run tries again.
                    EXECUTE format('LOCK TABLE slawatch.%I IN ACCESS EXCLUSIVE MODE', part);
                END IF;
            END LOOP;
            locked := true;
        END LOOP;
        IF kept AND locked THEN
            -- Kept since pass 1 (a replay, an ack): its partitions stay locked until
            -- the call ends, so it ends here; the next run goes on past the range.
            RETURN;
        END IF;
        CONTINUE WHEN kept;
        n := r.n;
        -- A partition dropped already counts as empty (to_regclass: NULL, no row).
        alerts := coalesce((SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c
                             WHERE c.oid = to_regclass(format('slawatch.%I', 'alert_h' || r.n))),
                           0);
        deliveries := coalesce((SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c
                                 WHERE c.oid = to_regclass(format('slawatch.%I',
                                                                  'delivery_h' || r.n))),
                               0);
        EXECUTE format('DROP TABLE IF EXISTS slawatch.%I, slawatch.%I, slawatch.%I, slawatch.%I',
                       'outbox_send_h' || r.n, 'outbox_row_h' || r.n,
                       'delivery_h' || r.n, 'alert_h' || r.n);
        WITH gone AS (
            DELETE FROM slawatch.ack k
             WHERE k.acked_at < cutoff AND k.alert_id >= r.low AND k.alert_id < r.high
            RETURNING 1)
        SELECT count(*) INTO acks FROM gone;
        DELETE FROM slawatch.history_range h WHERE h.n = r.n;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;

-- The whole conversion in one transaction (migrate --print, a fresh migrate): 0015's,
-- then the open range takes the rows.
ALTER FUNCTION slawatch.history_convert_all(timestamptz) RENAME TO history_convert_alerts;
CREATE FUNCTION slawatch.history_convert_all(now timestamptz) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    copied bigint := slawatch.history_convert_alerts(now);
BEGIN
    PERFORM slawatch.history_rows_open();
    RETURN copied;
END
$$;

REVOKE ALL ON FUNCTION slawatch.history_open_rows(integer, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION slawatch.history_rows_open() FROM PUBLIC;
