-- Issue 27: history that rotates, robust (docs/how-to/operate.md, "History and
-- retention"). A rotation or a drop that fails is one warning line of the retention job
-- (slawatch/runtime/maintain.py), which goes on with the rest and tries again at its next
-- run. 0015_rotate.sql's functions caught a lock timeout themselves and returned as if
-- nothing were due: the job could not say why nothing was dropped, and history_drop had
-- already deleted the range's old acks when its DROP gave up. Now:
-- - history_rotate and history_drop let every error through (a lock not granted within
--   their lock_timeout included): the whole call is undone, the acks with it;
-- - history_drop drops a range whose partitions were dropped already (by hand) instead
--   of failing at every run on the missing table: it forgets the range.
-- The signatures and results are 0015's: CREATE OR REPLACE keeps their grants.

CREATE OR REPLACE FUNCTION slawatch.history_rotate(now timestamptz, every interval)
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
    -- A lock not granted within the lock_timeout (long transactions on the outbox) is
    -- an error: the retention job says so in one line and tries again at its next run.
    PERFORM slawatch.history_open(cur.n + 1, cur.high, cur.high + 4294967296, now);
    UPDATE slawatch.history_range r SET closed_at = now WHERE r.n = cur.n;
    IF drawn < cur.high THEN
        PERFORM setval(seq, cur.high, false);  -- last: not undone by a rollback
    END IF;
    RETURN cur.n + 1;
END
$$;

CREATE OR REPLACE FUNCTION slawatch.history_drop(cutoff timestamptz)
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
        -- A partition dropped already counts as empty (to_regclass: NULL, no row).
        alerts := coalesce((SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c
                             WHERE c.oid = to_regclass(format('slawatch.%I', 'alert_h' || r.n))),
                           0);
        deliveries := coalesce((SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c
                                 WHERE c.oid = to_regclass(format('slawatch.%I',
                                                                  'delivery_h' || r.n))),
                               0);
        -- No exception block: a lock not granted in time undoes the whole call, these
        -- acks with it (the job's next run tries again).
        EXECUTE format('DROP TABLE IF EXISTS slawatch.%I, slawatch.%I',
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

-- Nothing reads these (prune_history takes each range's bounds from prune_ranges).
DROP FUNCTION slawatch.history_lo(timestamptz), slawatch.history_hi(timestamptz);
