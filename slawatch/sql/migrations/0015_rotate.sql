-- Issue 27: history that rotates (docs/explanation/architecture.md, "History in ranges").
-- slawatch.alert and slawatch.delivery become tables partitioned by alert id ranges: a
-- range holds the alerts whose ids were drawn while it was open (one rotation period,
-- a seventh of SLAWATCH_RETENTION) with their deliveries, and retention drops a whole range once
-- its newest alert is older than the window and nothing in it must be kept.
--
-- This migration only adds, in one short transaction: the record of the ranges, the
-- partitioned tables beside the old ones (alert_rotating, delivery_rotating), and the
-- functions. `slawatch migrate` then converts the outbox in bounded, resumable steps
-- (slawatch/engine/rotate.py): triggers keep the new tables in step with the old, the
-- old rows are copied in batches by id with the progress recorded here, and one short
-- transaction swaps the names. Until then slawatch runs on the old tables as before.

-- One row per id range: alert ids in [low, high) and their deliveries are the
-- partitions alert_h<n> and delivery_h<n>. The open range (closed_at NULL) is where new
-- ids are drawn; closed_at: when the next one opened, so its newest alert fired
-- before then (the application's clock).
CREATE TABLE slawatch.history_range (
    n          integer     PRIMARY KEY,
    low        bigint      NOT NULL,
    high       bigint      NOT NULL,
    opened_at  timestamptz NOT NULL,
    closed_at  timestamptz,
    CONSTRAINT history_range_bounds CHECK (low < high)
);

-- The conversion's progress (one row while it runs and after): the old rows with ids up
-- to alert_upto / delivery_upto are copied in batches; *_done is how far it got.
CREATE TABLE slawatch.history_convert (
    one             boolean     PRIMARY KEY DEFAULT true CONSTRAINT history_convert_one CHECK (one),
    started_at      timestamptz NOT NULL,
    alert_upto      bigint      NOT NULL,
    delivery_upto   bigint      NOT NULL,
    alert_done      bigint      NOT NULL DEFAULT 0,
    delivery_done   bigint      NOT NULL DEFAULT 0,
    swapped_at      timestamptz
);

-- The outbox's tables, partitioned. Same columns, constraints and indexes as
-- 0001 made them (and later migrations changed them), but:
-- - alert_once (rule, key, episode, n) is no longer global: a unique index on a
--   partitioned table must hold its partition key. Each partition has its own
--   (alert_h<n>_once), made with it; the claim's ON CONFLICT DO NOTHING checks the
--   partition its row goes to.
-- - delivery is partitioned by alert_id (delivery_once stays a global constraint);
--   its id is unique by its identity, indexed (delivery_id) but not a primary key.
CREATE TABLE slawatch.alert_rotating (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    rule        text        NOT NULL,
    key         text        NOT NULL,
    episode     integer     NOT NULL,
    n           integer     NOT NULL,
    severity    text        NOT NULL,
    deadline    timestamptz,
    due_at      timestamptz,
    fired_at    timestamptz NOT NULL,
    row_data    jsonb       NOT NULL,
    kind        text        NOT NULL DEFAULT 'firing'
                            CONSTRAINT alert_rotating_kind
                            CHECK (kind IN ('firing', 'resolved', 'summary')),
    CONSTRAINT alert_rotating_pkey PRIMARY KEY (id)
) PARTITION BY RANGE (id);
CREATE INDEX alert_rotating_rule_fired ON slawatch.alert_rotating (rule, fired_at);

CREATE TABLE slawatch.delivery_rotating (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    alert_id         bigint      NOT NULL,
    notifier         text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                                 CONSTRAINT delivery_rotating_status
                                 CHECK (status IN ('pending', 'sent', 'dead', 'silenced',
                                                   'summarized', 'acknowledged', 'orphaned')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    last_error       text,
    sent_at          timestamptz,
    summary_id       bigint,
    CONSTRAINT delivery_rotating_once UNIQUE (alert_id, notifier)
) PARTITION BY RANGE (alert_id);
CREATE INDEX delivery_rotating_id ON slawatch.delivery_rotating (id);
CREATE INDEX delivery_rotating_summary ON slawatch.delivery_rotating (summary_id, alert_id)
    WHERE summary_id IS NOT NULL;
CREATE INDEX delivery_rotating_due ON slawatch.delivery_rotating (notifier, next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX delivery_rotating_dead ON slawatch.delivery_rotating (alert_id)
    WHERE status = 'dead';
CREATE INDEX delivery_rotating_orphaned ON slawatch.delivery_rotating (notifier, alert_id)
    WHERE status = 'orphaned';

-- The partitions of range n, made empty (so the unique index costs nothing) in one
-- transaction. CREATE TABLE ... PARTITION OF locks the parent briefly: a rotation
-- makes the next range before any id is drawn from it.
CREATE FUNCTION slawatch.history_open(n integer, low bigint, high bigint, at timestamptz)
    RETURNS void LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    alerts text := CASE WHEN to_regclass('slawatch.alert_rotating') IS NULL
                        THEN 'alert' ELSE 'alert_rotating' END;
    deliveries text := CASE WHEN to_regclass('slawatch.delivery_rotating') IS NULL
                            THEN 'delivery' ELSE 'delivery_rotating' END;
BEGIN
    EXECUTE format('CREATE TABLE slawatch.%I PARTITION OF slawatch.%I FOR VALUES FROM (%s) TO (%s)',
                   'alert_h' || n, alerts, low, high);
    EXECUTE format('CREATE UNIQUE INDEX %I ON slawatch.%I (rule, key, episode, n)',
                   'alert_h' || n || '_once', 'alert_h' || n);
    -- fillfactor 40: room on each page for its deliveries' leased versions, so that a
    -- lease stays a HOT update (0014_delivery_lease.sql; a partitioned parent takes no
    -- storage parameters, each partition is given it).
    EXECUTE format('CREATE TABLE slawatch.%I PARTITION OF slawatch.%I FOR VALUES FROM (%s) TO (%s)'
                   ' WITH (fillfactor = 40)',
                   'delivery_h' || n, deliveries, low, high);
    INSERT INTO slawatch.history_range (n, low, high, opened_at)
    VALUES (history_open.n, history_open.low, history_open.high, history_open.at);
END
$$;

-- The rotation (slawatch/runtime/maintain.py): when the open range was opened `every`
-- ago (or half its ids are drawn), the next range is made and the alert id sequence
-- moved to its first id, last: until then every id drawn falls in the open range.
-- Returns the range opened, or NULL. Before the conversion, nothing.
CREATE FUNCTION slawatch.history_rotate(now timestamptz, every interval)
    RETURNS integer LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET lock_timeout = '2s' AS $$
DECLARE
    cur slawatch.history_range;
    seq regclass;
    drawn bigint;
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
    IF cur.opened_at > now - every AND drawn < cur.low + (cur.high - cur.low) / 2 THEN
        RETURN NULL;
    END IF;
    BEGIN
        PERFORM slawatch.history_open(cur.n + 1, cur.high, cur.high + 4294967296, now);
    EXCEPTION WHEN lock_not_available THEN
        RETURN NULL;  -- long transactions on the outbox: the next run tries again
    END;
    UPDATE slawatch.history_range r SET closed_at = now WHERE r.n = cur.n;
    IF drawn < cur.high THEN
        PERFORM setval(seq, cur.high, false);  -- last: not undone by a rollback
    END IF;
    RETURN cur.n + 1;
END
$$;

-- Retention's drop (slawatch/runtime/maintain.py): the oldest closed range whose
-- newest alert fired before `cutoff` and that holds nothing retention keeps -- a
-- pending delivery (a webhook action's unsettled attempt is one), an alert named by
-- an ack from after the cutoff -- is dropped whole, with the acks that name its alerts.
-- One range per call (one short transaction); returns it and its size (the
-- planner's counts, as of the last ANALYZE), or no row when none can go.
CREATE FUNCTION slawatch.history_drop(cutoff timestamptz)
    RETURNS TABLE (n integer, alerts bigint, deliveries bigint, acks bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET lock_timeout = '2s' AS $$
DECLARE
    r slawatch.history_range;
BEGIN
    IF to_regclass('slawatch.alert_rotating') IS NOT NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('slawatch.history_range', 0));
    FOR r IN SELECT * FROM slawatch.history_range h
              WHERE h.closed_at < cutoff ORDER BY h.n LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM slawatch.delivery d
                               WHERE d.alert_id >= r.low AND d.alert_id < r.high
                                 AND d.status = 'pending');
        CONTINUE WHEN EXISTS (SELECT 1 FROM slawatch.ack k
                               WHERE k.acked_at >= cutoff
                                 AND k.alert_id >= r.low AND k.alert_id < r.high);
        n := r.n;
        SELECT greatest(c.reltuples, 0)::bigint INTO alerts
          FROM pg_class c WHERE c.oid = format('slawatch.%I', 'alert_h' || r.n)::regclass;
        SELECT greatest(c.reltuples, 0)::bigint INTO deliveries
          FROM pg_class c WHERE c.oid = format('slawatch.%I', 'delivery_h' || r.n)::regclass;
        WITH gone AS (
            DELETE FROM slawatch.ack k
             WHERE k.acked_at < cutoff AND k.alert_id >= r.low AND k.alert_id < r.high
            RETURNING 1)
        SELECT count(*) INTO acks FROM gone;
        BEGIN
            EXECUTE format('DROP TABLE slawatch.%I, slawatch.%I',
                           'delivery_h' || r.n, 'alert_h' || r.n);
        EXCEPTION WHEN lock_not_available THEN
            RETURN;  -- long transactions on the outbox: the next run tries again
        END;
        DELETE FROM slawatch.history_range h WHERE h.n = r.n;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;

-- The ids of the ranges closed at or after `cutoff`, [history_lo, history_hi): the
-- row-by-row prune (queries.sql prune_history) leaves them to history_drop. Stable:
-- the partitions they exclude are pruned once, when the statement starts.
CREATE FUNCTION slawatch.history_lo(cutoff timestamptz) RETURNS bigint
    LANGUAGE sql STABLE AS $$
    SELECT coalesce(min(h.low), 0) FROM slawatch.history_range h WHERE h.closed_at >= cutoff
$$;
CREATE FUNCTION slawatch.history_hi(cutoff timestamptz) RETURNS bigint
    LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(h.high), 0) FROM slawatch.history_range h WHERE h.closed_at >= cutoff
$$;

REVOKE ALL ON FUNCTION slawatch.history_open(integer, bigint, bigint, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION slawatch.history_rotate(timestamptz, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION slawatch.history_drop(timestamptz) FROM PUBLIC;

-- The conversion's triggers (installed and removed by slawatch/engine/rotate.py): every
-- write to the old tables is made to the new ones too, so the batches copy each old
-- row once and what changes meanwhile follows. A row a batch copies after its change
-- was mirrored conflicts and is left as the mirror wrote it (the later one).
CREATE FUNCTION slawatch.history_mirror_alert() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM slawatch.alert_rotating WHERE id = OLD.id;
        RETURN NULL;
    END IF;
    INSERT INTO slawatch.alert_rotating (id, rule, key, episode, n, severity, deadline, due_at,
                                         fired_at, row_data, kind)
    OVERRIDING SYSTEM VALUE
    VALUES (NEW.id, NEW.rule, NEW.key, NEW.episode, NEW.n, NEW.severity, NEW.deadline,
            NEW.due_at, NEW.fired_at, NEW.row_data, NEW.kind)
    ON CONFLICT (id) DO UPDATE
       SET severity = excluded.severity, deadline = excluded.deadline,
           due_at = excluded.due_at, fired_at = excluded.fired_at,
           row_data = excluded.row_data, kind = excluded.kind;
    RETURN NULL;
END
$$;

CREATE FUNCTION slawatch.history_mirror_delivery() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM slawatch.delivery_rotating
         WHERE alert_id = OLD.alert_id AND notifier = OLD.notifier;
        RETURN NULL;
    END IF;
    INSERT INTO slawatch.delivery_rotating (id, alert_id, notifier, status, attempts,
                                            next_attempt_at, lease_owner, lease_expires_at,
                                            last_error, sent_at, summary_id)
    OVERRIDING SYSTEM VALUE
    VALUES (NEW.id, NEW.alert_id, NEW.notifier, NEW.status, NEW.attempts,
            NEW.next_attempt_at, NEW.lease_owner, NEW.lease_expires_at, NEW.last_error,
            NEW.sent_at, NEW.summary_id)
    ON CONFLICT ON CONSTRAINT delivery_rotating_once DO UPDATE
       SET status = excluded.status, attempts = excluded.attempts,
           next_attempt_at = excluded.next_attempt_at, lease_owner = excluded.lease_owner,
           lease_expires_at = excluded.lease_expires_at, last_error = excluded.last_error,
           sent_at = excluded.sent_at, summary_id = excluded.summary_id;
    RETURN NULL;
END
$$;

-- The whole conversion in one transaction, for `migrate --print` (psql has no
-- batches): the old tables are locked against writes until the copy commits, so
-- this is for an empty or small outbox; `slawatch migrate` converts a large one in
-- resumable batches instead (slawatch/engine/rotate.py: the same ranges and names).
CREATE FUNCTION slawatch.history_convert_all(now timestamptz) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    alert_upto bigint;
    delivery_upto bigint;
    lows bigint[];
    newest timestamptz[];
    i integer;
    t text;
    g record;
    last_alert bigint;
    last_delivery bigint;
    copied bigint := 0;
    moved bigint;
BEGIN
    IF to_regclass('slawatch.alert_rotating') IS NULL THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT 1 FROM slawatch.history_convert) THEN
        RAISE EXCEPTION 'slawatch migrate is converting the outbox in batches: run it to the end';
    END IF;
    LOCK TABLE slawatch.alert, slawatch.delivery IN ACCESS EXCLUSIVE MODE;
    SELECT coalesce(max(id), 0) INTO alert_upto FROM slawatch.alert;
    SELECT coalesce(max(id), 0) INTO delivery_upto FROM slawatch.delivery;
    INSERT INTO slawatch.history_convert (started_at, alert_upto, delivery_upto,
                                          alert_done, delivery_done)
    VALUES (now, alert_upto, delivery_upto, alert_upto, delivery_upto);
    SELECT coalesce(array_agg(d.low ORDER BY d.low), '{}'),
           coalesce(array_agg(d.newest ORDER BY d.low), '{}')
      INTO lows, newest
      FROM (SELECT min(a.id) AS low, max(a.fired_at) AS newest FROM slawatch.alert a
             GROUP BY date_trunc('day', a.fired_at, 'UTC')) d;
    FOR i IN 1 .. coalesce(array_length(lows, 1), 0) LOOP
        PERFORM slawatch.history_open(i - 1, CASE WHEN i = 1 THEN 0 ELSE lows[i] END,
                                      CASE WHEN i < array_length(lows, 1) THEN lows[i + 1]
                                           ELSE alert_upto + 1 END, now);
        UPDATE slawatch.history_range r
           SET closed_at = least((SELECT max(x) FROM unnest(newest[1:i]) x), now)
         WHERE r.n = i - 1;
    END LOOP;
    PERFORM slawatch.history_open(coalesce(array_length(lows, 1), 0),
                                  CASE WHEN alert_upto > 0 THEN alert_upto + 1 ELSE 0 END,
                                  (alert_upto / 4294967296 + 1) * 4294967296, now);
    INSERT INTO slawatch.alert_rotating (id, rule, key, episode, n, severity, deadline, due_at,
                                         fired_at, row_data, kind)
    OVERRIDING SYSTEM VALUE
    SELECT id, rule, key, episode, n, severity, deadline, due_at, fired_at, row_data, kind
      FROM slawatch.alert;
    GET DIAGNOSTICS moved = ROW_COUNT;
    copied := copied + moved;
    INSERT INTO slawatch.delivery_rotating (id, alert_id, notifier, status, attempts,
                                            next_attempt_at, lease_owner, lease_expires_at,
                                            last_error, sent_at, summary_id)
    OVERRIDING SYSTEM VALUE
    SELECT id, alert_id, notifier, status, attempts, next_attempt_at, lease_owner,
           lease_expires_at, last_error, sent_at, summary_id
      FROM slawatch.delivery;
    GET DIAGNOSTICS moved = ROW_COUNT;
    copied := copied + moved;
    FOREACH t IN ARRAY ARRAY['alert', 'delivery'] LOOP
        FOR g IN SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS who,
                        a.privilege_type, a.is_grantable
                   FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
                  WHERE c.oid = format('slawatch.%I', t)::regclass AND a.grantee <> c.relowner LOOP
            EXECUTE format('GRANT %s ON slawatch.%I TO %s%s', g.privilege_type, t || '_rotating',
                           g.who, CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
    last_alert := pg_sequence_last_value(pg_get_serial_sequence('slawatch.alert', 'id')::regclass);
    last_delivery := pg_sequence_last_value(
        pg_get_serial_sequence('slawatch.delivery', 'id')::regclass);
    DROP TABLE slawatch.alert, slawatch.delivery;
    ALTER TABLE slawatch.alert_rotating RENAME TO alert;
    ALTER TABLE slawatch.alert RENAME CONSTRAINT alert_rotating_pkey TO alert_pkey;
    ALTER TABLE slawatch.alert RENAME CONSTRAINT alert_rotating_kind TO alert_kind;
    ALTER INDEX slawatch.alert_rotating_rule_fired RENAME TO alert_rule_fired;
    ALTER SEQUENCE slawatch.alert_rotating_id_seq RENAME TO alert_id_seq;
    ALTER TABLE slawatch.delivery_rotating RENAME TO delivery;
    ALTER TABLE slawatch.delivery RENAME CONSTRAINT delivery_rotating_once TO delivery_once;
    ALTER TABLE slawatch.delivery RENAME CONSTRAINT delivery_rotating_status TO delivery_status;
    ALTER INDEX slawatch.delivery_rotating_id RENAME TO delivery_id;
    ALTER INDEX slawatch.delivery_rotating_summary RENAME TO delivery_summary;
    ALTER INDEX slawatch.delivery_rotating_due RENAME TO delivery_due;
    ALTER INDEX slawatch.delivery_rotating_dead RENAME TO delivery_dead;
    ALTER INDEX slawatch.delivery_rotating_orphaned RENAME TO delivery_orphaned;
    ALTER SEQUENCE slawatch.delivery_rotating_id_seq RENAME TO delivery_id_seq;
    IF last_alert IS NOT NULL THEN
        PERFORM setval('slawatch.alert_id_seq', last_alert);
    END IF;
    IF last_delivery IS NOT NULL THEN
        PERFORM setval('slawatch.delivery_id_seq', last_delivery);
    END IF;
    CREATE TRIGGER action_settled
        AFTER UPDATE OF status ON slawatch.delivery
        FOR EACH ROW
        WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.notifier LIKE 'action:%')
        EXECUTE FUNCTION slawatch.action_delivery_settled();
    UPDATE slawatch.history_convert SET swapped_at = now;
    RETURN copied;
END
$$;
