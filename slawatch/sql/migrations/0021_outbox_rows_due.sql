-- Issue 27: the delivery workers' "anything due?" (0017_deliveries_due.sql) also asks the
-- outbox in rows (0020_outbox_rows.sql; docs/explanation/outbox-rows.md): a send to the
-- notifier that is pending, due and not leased. The same read as for deliveries: the
-- earliest due time of the notifier's pending sends (outbox_send_due), stepping over
-- the sends in flight, compared with `at` outside the subquery, so that the generic
-- plan is the custom one. An idle notifier still costs one query per wake, two index
-- probes. It also answers yes for a resolved row's send held back behind a firing row's
-- (the lease then takes nothing, as the claim does for a held resolved notice).

CREATE OR REPLACE FUNCTION slawatch.deliveries_due(notifier_name text, at timestamptz)
    RETURNS boolean LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN coalesce((SELECT d.next_attempt_at FROM slawatch.delivery d
                      WHERE d.notifier = notifier_name AND d.status = 'pending'
                        AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= at)
                      ORDER BY d.next_attempt_at LIMIT 1) <= at, false)
        OR coalesce((SELECT s.next_attempt_at FROM slawatch.outbox_send s
                      WHERE s.notifier = notifier_name AND s.status = 'pending'
                        AND (s.lease_expires_at IS NULL OR s.lease_expires_at <= at)
                      ORDER BY s.next_attempt_at LIMIT 1) <= at, false);
END
$$;
