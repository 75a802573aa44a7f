-- Issue 27: the delivery workers' "anything due?" (0017_deliveries_due.sql,
-- 0021_outbox_rows_due.sql) answered per shape of the outbox: `deliveries` (today's,
-- slawatch.delivery) and `sends` (the outbox in rows, slawatch.outbox_send;
-- docs/explanation/outbox-rows.md). A worker claims deliveries only where some are due
-- and leases row sends only where some are due, and between two turns of row sends it
-- asks this instead of claiming deliveries (slawatch/delivery/dispatcher.py,
-- deliver_notifier): a worker draining rows ran a claim of deliveries that took nothing
-- every ten sends. The same two reads as before (the earliest due time of the
-- notifier's pending entries, through delivery_due and outbox_send_due, stepping over
-- those in flight, compared with `at` outside the subquery so that the generic plan is
-- the custom one), each answered on its own. Held resolved notices count as due, as
-- before. deliveries_due keeps its answer (either shape), for a process of the release
-- before this one.

CREATE OR REPLACE FUNCTION slawatch.deliveries_due_by_shape(
        notifier_name text, at timestamptz, OUT deliveries boolean, OUT sends boolean)
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    deliveries := coalesce((SELECT d.next_attempt_at FROM slawatch.delivery d
                             WHERE d.notifier = notifier_name AND d.status = 'pending'
                               AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= at)
                             ORDER BY d.next_attempt_at LIMIT 1) <= at, false);
    sends := coalesce((SELECT s.next_attempt_at FROM slawatch.outbox_send s
                        WHERE s.notifier = notifier_name AND s.status = 'pending'
                          AND (s.lease_expires_at IS NULL OR s.lease_expires_at <= at)
                        ORDER BY s.next_attempt_at LIMIT 1) <= at, false);
END
$$;
