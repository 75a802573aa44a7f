-- Issue 27: a lean outbox (docs/explanation/architecture.md, "History in ranges").
-- A delivery is looked up by its alert id and then its own (delivery_once, (alert_id,
-- notifier): an alert has one to three deliveries), never by its id alone: every
-- statement that finds deliveries by id has their alert ids (queries.sql, action_webhook.sql).
-- delivery_id, the index of delivery.id in each range, was one more index entry per
-- delivery written by every claim and read by none of them: it goes, from the ranges
-- there are (the partitioned index takes its partitions' with it) and from those to come
-- (a range's partitions get their parent's indexes; the parent no longer has it).
-- Before the outbox is converted into id ranges it is delivery_rotating_id (renamed at
-- the swap: history_convert_all below no longer renames it, nor does
-- slawatch/engine/rotate.py); the old, unpartitioned delivery table keeps its primary key
-- until the swap drops the table.
DROP INDEX IF EXISTS slawatch.delivery_id;
DROP INDEX IF EXISTS slawatch.delivery_rotating_id;

-- 0015_rotate.sql's, without delivery_id (the signature is 0015's: CREATE OR REPLACE).
CREATE OR REPLACE FUNCTION slawatch.history_convert_all(now timestamptz) RETURNS bigint
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
