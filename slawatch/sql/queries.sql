-- Fixed queries, one block each under a "-- name --" header.
-- The per-rule claim is composed in claim.py from the rule's identifiers.

-- claim_deliveries --
-- One notifier's due deliveries, leased to one owner; SKIP LOCKED lets processes
-- (and the workers of one process) share the work. A lease that expired is due
-- again (next_attempt_at = lease expiry), so this same compare-and-set UPDATE
-- rescues it under a new owner.
-- A worker that just sent a full batch settles it here too (`sent`, leased to
-- `sent_owner`, fenced like mark_sent), so a busy worker pays one statement and
-- one commit per batch, not two; a first claim passes an empty `sent`. The claim
-- skips those ids: once their lease ran out mid-send they are due again, and one
-- statement would then both settle and re-lease the same row (both CTEs see the
-- same snapshot; of two updates of one row PostgreSQL keeps one, unpredictably).
WITH sent AS (
    UPDATE slawatch.delivery
       SET status = 'sent', sent_at = %(now)s, lease_owner = NULL, lease_expires_at = NULL,
           last_error = NULL
     WHERE id = ANY(%(sent)s::bigint[]) AND lease_owner = %(sent_owner)s::uuid
), due AS (
    SELECT id FROM slawatch.delivery
     WHERE status = 'pending' AND notifier = %(notifier)s AND next_attempt_at <= %(now)s
       AND id <> ALL(%(sent)s::bigint[])
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
-- Fenced: only the owner of the current lease may finish a delivery. One statement
-- settles the whole batch. The owner id is fresh per claim and every settle clears
-- it in the write that leaves 'pending', so it also says the row is still pending:
-- no `status = 'pending'` here, which let the planner scan every pending delivery
-- through delivery_due instead of probing the primary key (measured: 8 ms per 100
-- with 10 k pending, growing with the backlog; now 2 ms). The ::bigint[] keeps
-- psycopg from sending a smallint[] for small ids.
UPDATE slawatch.delivery
   SET status = 'sent', sent_at = %(now)s, lease_owner = NULL, lease_expires_at = NULL,
       last_error = NULL
 WHERE id = ANY(%(ids)s::bigint[]) AND lease_owner = %(owner)s;

-- mark_retry --
-- Each delivery at its own next attempt time (its own backoff): ids[i] at nexts[i].
UPDATE slawatch.delivery d
   SET next_attempt_at = r.next_at, lease_owner = NULL, lease_expires_at = NULL,
       last_error = %(error)s
  FROM unnest(%(ids)s::bigint[], %(nexts)s::timestamptz[]) AS r(id, next_at)
 WHERE d.id = r.id AND d.status = 'pending' AND d.lease_owner = %(owner)s;

-- mark_dead --
-- Fenced like mark_sent.
UPDATE slawatch.delivery
   SET status = 'dead', lease_owner = NULL, lease_expires_at = NULL, last_error = %(error)s
 WHERE id = ANY(%(ids)s::bigint[]) AND lease_owner = %(owner)s;

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

-- prune_history --
-- One bounded batch of history (maintain.py): alerts fired before the cutoff none
-- of whose deliveries is pending, removed with their deliveries. Old alerts are
-- found per rule through alert_rule_fired; the rules by a skip scan of the same
-- index (one probe per rule), so a batch reads the old rows, not the table.
-- Each alert's deliveries are read through delivery_once (by alert_id): an
-- aggregate subquery stays a lookup per alert, where a NOT EXISTS could become
-- an anti join reading every pending delivery (delivery_due) for each batch.
-- A dead delivery replayed to pending while this runs: its DELETE re-checks the
-- status and skips it, and its alert is kept (not all of its deliveries went).
WITH RECURSIVE rules AS (
    SELECT min(rule) AS rule FROM slawatch.alert
    UNION ALL
    SELECT (SELECT min(a.rule) FROM slawatch.alert a WHERE a.rule > r.rule)
      FROM rules r
     WHERE r.rule IS NOT NULL
), old AS (
    SELECT o.id
      FROM rules r CROSS JOIN LATERAL (
            SELECT a.id FROM slawatch.alert a
             WHERE a.rule = r.rule AND a.fired_at < %(cutoff)s
               AND (SELECT bool_or(p.status = 'pending') FROM slawatch.delivery p
                     WHERE p.alert_id = a.id) IS NOT TRUE
             ORDER BY a.fired_at
             LIMIT %(batch)s) o
     LIMIT %(batch)s
), gone_deliveries AS (
    DELETE FROM slawatch.delivery d
     WHERE d.alert_id = ANY (ARRAY(SELECT id FROM old)) AND d.status <> 'pending'
    RETURNING d.id
), gone_alerts AS (
    DELETE FROM slawatch.alert a
     WHERE a.id = ANY (ARRAY(SELECT id FROM old))
       AND (SELECT bool_and(k.id IN (SELECT g.id FROM gone_deliveries g))
              FROM slawatch.delivery k
             WHERE k.alert_id = a.id) IS NOT FALSE
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone_alerts), (SELECT count(*) FROM gone_deliveries);

-- outbox_gauges --
-- Per notifier: deliveries pending (due, leased or waiting to retry), when the alert of
-- the oldest of them fired, and deliveries dead; read at each metrics scrape. Pending
-- ones are read through delivery_due, dead ones through delivery_dead: the cost is the
-- backlog's, not the history's. Alert ids follow claim order, so the least alert id is
-- the oldest alert without joining every pending delivery to its alert.
WITH pending AS (
    SELECT notifier, count(*) AS pending, min(alert_id) AS oldest
      FROM slawatch.delivery WHERE status = 'pending' GROUP BY notifier
), dead AS (
    SELECT notifier, count(*) AS dead
      FROM slawatch.delivery WHERE status = 'dead' GROUP BY notifier
)
SELECT coalesce(p.notifier, d.notifier) AS notifier, coalesce(p.pending, 0) AS pending,
       a.fired_at AS oldest_fired_at, coalesce(d.dead, 0) AS dead
  FROM pending p FULL JOIN dead d ON d.notifier = p.notifier
  LEFT JOIN slawatch.alert a ON a.id = p.oldest;
