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

-- record_scan --
-- The last scan of a rule (slawatch/scans.py): one small row per rule, overwritten.
INSERT INTO slawatch.scan AS s (rule, last_at, duration_ms, claimed, error)
VALUES (%(rule)s, %(at)s, %(duration_ms)s, %(claimed)s, %(error)s)
ON CONFLICT (rule) DO UPDATE
   SET last_at = excluded.last_at, duration_ms = excluded.duration_ms,
       claimed = excluded.claimed, error = excluded.error;

-- last_scans --
SELECT rule, last_at, duration_ms, claimed, error FROM slawatch.scan;

-- delivery_backlog --
-- Per rule: pending deliveries (through delivery_due) with the fired_at of the oldest
-- one's alert, and dead deliveries (through delivery_dead); sent history is not read.
WITH pending AS (
    SELECT a.rule, count(*) AS pending, min(a.fired_at) AS oldest
      FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id
     WHERE d.status = 'pending'
     GROUP BY a.rule
), dead AS (
    SELECT a.rule, count(*) AS dead
      FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id
     WHERE d.status = 'dead'
     GROUP BY a.rule
)
SELECT rule, COALESCE(p.pending, 0), COALESCE(x.dead, 0), p.oldest
  FROM pending p FULL JOIN dead x USING (rule);

-- list_alerts --
-- Newest first, a page at a time: `before` is the last id of the previous page (keyset
-- pagination: a page costs the same however deep it is). A filter left NULL is off;
-- the plan is made for the values given (no prepared statements), so a NULL filter
-- costs nothing. `status`: alerts with at least one delivery in that status.
SELECT a.id, a.rule, a.key, a.episode, a.n, a.severity, a.deadline, a.due_at, a.fired_at,
       a.row_data
  FROM slawatch.alert a
 WHERE (%(rule)s::text IS NULL OR a.rule = %(rule)s::text)
   AND (%(since)s::timestamptz IS NULL OR a.fired_at >= %(since)s::timestamptz)
   AND (%(before)s::bigint IS NULL OR a.id < %(before)s::bigint)
   AND (%(status)s::text IS NULL OR EXISTS (
            SELECT 1 FROM slawatch.delivery d
             WHERE d.alert_id = a.id AND d.status = %(status)s::text))
 ORDER BY a.id DESC
 LIMIT %(limit)s;

-- alert_by_id --
SELECT id, rule, key, episode, n, severity, deadline, due_at, fired_at, row_data
  FROM slawatch.alert WHERE id = %(id)s;

-- alert_by_name --
-- By its idempotency id's parts, through alert_once.
SELECT id, rule, key, episode, n, severity, deadline, due_at, fired_at, row_data
  FROM slawatch.alert
 WHERE rule = %(rule)s AND key = %(key)s AND episode = %(episode)s AND n = %(n)s;

-- deliveries_of --
SELECT alert_id, id, notifier, status, attempts, next_attempt_at, last_error, sent_at
  FROM slawatch.delivery
 WHERE alert_id = ANY(%(ids)s::bigint[])
 ORDER BY alert_id, notifier;

-- stats_alerts --
-- The whole kept history (SLAWATCH_RETENTION bounds it).
SELECT rule, severity, count(*) FROM slawatch.alert GROUP BY rule, severity ORDER BY rule, severity;

-- stats_deliveries --
SELECT notifier, status, count(*) FROM slawatch.delivery
 GROUP BY notifier, status ORDER BY notifier, status;
