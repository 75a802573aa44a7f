-- Fixed queries, one block each under a "-- name --" header.
-- The per-rule claim is composed in claim.py from the rule's identifiers.

-- claim_deliveries --
-- One notifier's due deliveries, leased to one owner; SKIP LOCKED lets processes
-- share the work. A lease that expired is due again (next_attempt_at = lease
-- expiry), so this same compare-and-set UPDATE rescues it under a new owner.
WITH due AS (
    SELECT id FROM slawatch.delivery
     WHERE status = 'pending' AND notifier = %(notifier)s AND next_attempt_at <= %(now)s
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
       a.rule, a.key, a.episode, a.n, a.severity, a.deadline, a.due_at, a.fired_at, a.row_data
  FROM leased l JOIN slawatch.alert a ON a.id = l.alert_id
 ORDER BY l.notifier, l.id;

-- mark_sent --
-- Fenced: only the owner of the current lease may finish a delivery.
UPDATE slawatch.delivery
   SET status = 'sent', sent_at = %(now)s, lease_owner = NULL, lease_expires_at = NULL,
       last_error = NULL
 WHERE id = ANY(%(ids)s) AND status = 'pending' AND lease_owner = %(owner)s;

-- mark_retry --
-- Each delivery at its own next attempt time (its own backoff): ids[i] at nexts[i].
UPDATE slawatch.delivery d
   SET next_attempt_at = r.next_at, lease_owner = NULL, lease_expires_at = NULL,
       last_error = %(error)s
  FROM unnest(%(ids)s::bigint[], %(nexts)s::timestamptz[]) AS r(id, next_at)
 WHERE d.id = r.id AND d.status = 'pending' AND d.lease_owner = %(owner)s;

-- mark_dead --
UPDATE slawatch.delivery
   SET status = 'dead', lease_owner = NULL, lease_expires_at = NULL, last_error = %(error)s
 WHERE id = ANY(%(ids)s) AND status = 'pending' AND lease_owner = %(owner)s;

-- replay --
-- Dead deliveries back to pending, as if new.
WITH replayed AS (
    UPDATE slawatch.delivery d
       SET status = 'pending', attempts = 0, next_attempt_at = %(now)s,
           lease_owner = NULL, lease_expires_at = NULL
      FROM slawatch.alert a
     WHERE a.id = d.alert_id AND d.status = 'dead'
       AND (%(rule)s::text IS NULL OR a.rule = %(rule)s::text)
       AND (%(notifier)s::text IS NULL OR d.notifier = %(notifier)s::text)
    RETURNING 1
)
SELECT count(*) FROM replayed;

-- wake_deliveries --
SELECT pg_notify('slawatch_delivery', '');
