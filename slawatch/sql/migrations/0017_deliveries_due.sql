-- Issue 27: the delivery workers' "anything due?" (docs/explanation/delivery.md,
-- "A delivery's life"). A worker wakes at each NOTIFY and at each poll, and it used to
-- claim at once: the claim statement is planned at every run (PostgreSQL never keeps
-- its generic plan; slawatch/sql/queries.sql, claim_deliveries), about 2.6 ms of server
-- time, four times a second for an idle notifier with four workers: half of an idle
-- slawatch's database time. It now asks this function first and claims only on yes.
-- PL/pgSQL keeps the plan of its statement per server process, behind a transaction
-- pooler too, and force_generic_plan skips the five custom plans: the only parameter
-- that reaches an index read is the notifier (equality), so the generic plan is the
-- custom one, the first entry of the notifier's due index (delivery_due) in each id
-- range, stepping over the deliveries in flight. The earliest due time is read and then
-- compared with `at`, never `next_attempt_at <= at` inside: a generic plan guesses a
-- third of the index below an unknown bound and may scan the table instead.
-- It answers yes for whatever the claim would take, and also for a resolved notice held
-- back behind its firing notification (the claim then takes nothing, as before).

CREATE FUNCTION slawatch.deliveries_due(notifier_name text, at timestamptz)
    RETURNS boolean LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN coalesce((SELECT d.next_attempt_at FROM slawatch.delivery d
                      WHERE d.notifier = notifier_name AND d.status = 'pending'
                        AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= at)
                      ORDER BY d.next_attempt_at LIMIT 1) <= at, false);
END
$$;
