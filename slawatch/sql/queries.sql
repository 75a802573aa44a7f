-- Fixed queries, one block each under a "-- name --" header.
-- The per-rule claim is composed in claim.py from the rule's identifiers.

-- claim_deliveries --
-- Due deliveries, leased to one owner; SKIP LOCKED lets processes share the work.
WITH due AS (
    SELECT id FROM slawatch.delivery
     WHERE status = 'pending' AND next_attempt_at <= %(now)s
     ORDER BY next_attempt_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE slawatch.delivery d
       SET lease_owner = %(owner)s,
           lease_expires_at = %(now)s + %(lease)s::interval,
           next_attempt_at = %(now)s + %(lease)s::interval,
           attempts = d.attempts + 1
      FROM due
     WHERE d.id = due.id
    RETURNING d.id, d.alert_id, d.notifier, d.attempts
)
SELECT l.id, l.notifier, l.attempts,
       a.rule, a.key, a.n, a.severity, a.deadline, a.due_at, a.fired_at, a.row_data
  FROM leased l JOIN slawatch.alert a ON a.id = l.alert_id
 ORDER BY l.notifier, l.id;

-- mark_sent --
-- Fenced: only the owner of the current lease may finish a delivery.
UPDATE slawatch.delivery
   SET status = 'sent', sent_at = %(now)s, lease_owner = NULL, lease_expires_at = NULL,
       last_error = NULL
 WHERE id = ANY(%(ids)s) AND status = 'pending' AND lease_owner = %(owner)s;

-- mark_retry --
UPDATE slawatch.delivery
   SET next_attempt_at = %(next)s, lease_owner = NULL, lease_expires_at = NULL,
       last_error = %(error)s
 WHERE id = ANY(%(ids)s) AND status = 'pending' AND lease_owner = %(owner)s;

-- mark_dead --
UPDATE slawatch.delivery
   SET status = 'dead', lease_owner = NULL, lease_expires_at = NULL, last_error = %(error)s
 WHERE id = ANY(%(ids)s) AND status = 'pending' AND lease_owner = %(owner)s;
