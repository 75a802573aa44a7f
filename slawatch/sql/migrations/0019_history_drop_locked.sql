-- Issue 27: a range is dropped only with what it held when its partitions were locked
-- (docs/how-to/operate.md, "History and retention"). 0016_rotate_retry.sql's
-- history_drop read whether a range held a pending delivery (or an alert acked within
-- the window) and then dropped its partitions, waiting for their lock: a `slawatch
-- replay` of one of the range's dead deliveries that committed while the DROP waited was
-- dropped with the range, though replay had counted it. Now a range that looks
-- droppable has its partitions locked first (delivery's, then alert's: the DROP's
-- order), and is looked at again after the lock: each statement of the function reads
-- what committed before it, so a replay or an ack that got in first keeps the range.
-- A range that looks kept is passed over without a lock, as before: one busy old range
-- does not hold back the call. One found kept only under the lock ends the call (its
-- locks would otherwise be held while the loop waits for the next range's). The signature and result are 0016's: CREATE OR REPLACE
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
            -- Kept: a delivery still to send, or an alert acked within the window.
            kept := EXISTS (SELECT 1 FROM slawatch.delivery d
                             WHERE d.alert_id >= r.low AND d.alert_id < r.high
                               AND d.status = 'pending')
                 OR EXISTS (SELECT 1 FROM slawatch.ack k
                             WHERE k.acked_at >= cutoff
                               AND k.alert_id >= r.low AND k.alert_id < r.high);
            EXIT WHEN kept OR pass = 2;
            FOREACH part IN ARRAY ARRAY['delivery_h' || r.n, 'alert_h' || r.n] LOOP
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
