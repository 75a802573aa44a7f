-- Fixed queries, one block each under a "-- name --" header.
-- The per-rule claim is composed in claim.py from the rule's identifiers.

-- claim_deliveries --
-- One notifier's due deliveries, leased to one owner; SKIP LOCKED lets processes
-- (and the workers of one process) share the work. A delivery is due when its
-- next_attempt_at has come and it is not leased (no lease_expires_at, or one that ran
-- out), so this same compare-and-set UPDATE rescues an expired lease under a new owner.
-- The lease writes only columns no index covers (lease_owner, lease_expires_at,
-- attempts; 0014_delivery_lease.sql leaves room on each page): a HOT update, no new
-- index entries. The price: leased deliveries keep their place in delivery_due, so a
-- claim steps over those in flight (at most `concurrency` batches per process) and
-- checks each one's lease in the heap.
-- A worker that just sent a full batch settles it here too (`sent`, leased to
-- `sent_owner`, fenced like mark_sent), so a busy worker pays one statement and
-- one commit per batch, not two; a first claim passes an empty `sent_alerts` and a
-- NULL owner. `sent` is found by its alert ids and the notifier (delivery_once: an
-- alert has one delivery per notifier) and the owner; the claim skips what is leased
-- to `sent_owner`: once those leases ran out mid-send they are due again, and one
-- statement would then both settle and re-lease the same row (both CTEs see the
-- same snapshot; of two updates of one row PostgreSQL keeps one, unpredictably).
-- The owner is fresh per claim, so what is leased to it is exactly the batch sent,
-- and each of these tests is one comparison per row: they were tests of each row
-- against the batch's ids (`id <> ALL(sent)`), whose cost grew with the batch's size
-- squared (bench/delivery.py: claims of 400 cost more per alert than claims of 100).
-- Each candidate's alert is read once, in `due` (a probe of its primary key), and
-- carried to the checks and the answer. The probe is a LATERAL subquery with OFFSET 0,
-- so that it stays a probe per due delivery taken in order from delivery_due: as a join,
-- on statistics gathered mid-drain, the planner hashed every alert and sorted every
-- pending delivery for each claim of 100 (auto_explain in bench/delivery.py: 100 ms
-- instead of 2).
-- The (alert, notifier) delivery of those two looks is read in a subquery with OFFSET 0,
-- so that its `status = 'pending'` stays outside: delivery_once is then the only index
-- that finds it. With the status inside, delivery_due qualifies too, and on statistics
-- that have the table empty (a first burst, before autoanalyze) the planner walked every
-- pending delivery of the notifier for each claimed row (measured: 4 claims of 100 still
-- running after 18 s with 20 k pending; tests/integration/test_deliver.py).
-- Per-episode order: a resolved notice is not due while a firing notification of its
-- episode to the same notifier is pending (due, in flight or waiting to retry), so no
-- receiver is told "resolved" before "firing" (PagerDuty and Alertmanager would open
-- an incident for good on the late trigger). The notifications of `sent` are settled by
-- this statement: they hold nothing back (when still leased to `sent_owner`). A
-- resolved notice costs a look at its episode's alerts (alert_once) and their
-- deliveries (delivery_once); one held back is looked at again by every claim of its
-- notifier until its notification is settled (measured: 5,000 held back add about
-- 60 ms to a claim; none, nothing).
-- Across shapes: nor while a firing row of its episode in the outbox in rows (rule, key
-- among its keys, that key's episode; docs/explanation/outbox-rows.md) has a pending
-- send to the notifier (the setting switched from 'rows' to 'alerts' mid-episode). That
-- look is a NOT IN of an uncorrelated subquery, which PostgreSQL hashes: the episodes of
-- the notifier's pending firing sends (outbox_send_due, each row by its primary key,
-- OFFSET 0 as in lease_row_send; the arrays unnested in the select list, a ProjectSet:
-- as a function scan in FROM each row's 100 elements went through a tuplestore, 27 ms
-- for 200 rows) read once per claim, and only by a claim that looks at a resolved
-- notice (the OR stops before it for a firing one); each resolved notice is then one
-- hash probe. Measured on the generic plan (EXPLAIN ANALYZE, timing off, medians of 15
-- claims of 100 resolved notices due among 20,000, on a loaded 2-core machine): without
-- rows, as before (2.9 ms a claim, 3.0 before); beside 200 pending sends (20,000
-- alerts), 9 ms instead of 2.7. As a look per resolved notice at each pending send (NOT
-- EXISTS) that was 110 ms: 20,000 probes of outbox_row's primary key.
-- A due delivery whose alert matches a silence active at `now` (the rule, the key
-- if the silence names one, and jsonb containment of its matchers in the alert's
-- row) is settled 'silenced' instead: never sent, still recorded. Each due row costs
-- one probe of silence_rule_ends. A firing notification of an acknowledged episode is
-- settled 'acknowledged' (one probe of ack's primary key): an ack settles what waits
-- at once (lifecycle.ack), this catches one that was in flight then and failed, and a
-- replayed one. Acks and silences are two semi-joins, not one OR of two EXISTS: the
-- planner estimates those as the few rows they are.
-- Settled rows come back with `settled` set, so the worker counts them towards a full
-- batch and claims again.
-- Its commit is asynchronous (`set_config(..., true)`: until the end of the transaction,
-- which the commit still is; evaluated once, as an InitPlan of `due`, which every claim
-- runs whether or not anything is due): it does not wait for the WAL flush (measured:
-- 8.6 ms median, 16 ms p90 on a loaded 2-core machine, most of a claim's time). What a
-- crash of the server may lose of it is harmless: a lost lease or 'sent' means the batch
-- is sent again (at least once); a lost silenced/acknowledged settle is decided again by
-- the next claim. At worst an alert is sent again, never lost; and a later synchronous
-- commit (mark_dead, any alert claim) flushes the WAL up to itself, this one included.
-- The ids of the rows of `sent` it settled come back too, as one more row: `settled`
-- 'sent', their ids in `sent`, nothing else (none when it settled none). One row, not
-- one per delivery: a hundred rows fewer to sort, send and decode per claim.
-- `sent` takes its rows' locks with SKIP LOCKED, so no claim ever waits for another:
-- `due` may lock a row that its snapshot still saw due although another worker has
-- leased it since (the row then fails the recheck, and is not returned, but stays
-- locked until that claim commits). Two workers whose claims each waited, in `sent`,
-- for such a lock of the other deadlocked (bench/delivery.py: one a round, a second
-- lost to deadlock_timeout each time). The worker settles what `sent` skipped with
-- mark_sent, which holds no other lock while it waits.
-- The outbox is partitioned by alert id ranges (0015_rotate.sql), and delivery.id has no
-- index (0018_lean_outbox.sql): every write finds its rows by alert id first, through
-- delivery_once (an alert has one to three deliveries). `sent` and `settled` join their
-- rows back by (alert_id, id): as a nested loop, each probe goes to its alert's range
-- (run-time pruning). `leased` takes its alert ids as an array (with the notifier, one
-- delivery each), probed in each range's delivery_once, and only in the ranges from
-- the batch's lowest alert id up (pruned when the statement runs): a join was hashed,
-- by a planner that prices a probe per range and row, over a scan of every range
-- (EXPLAIN ANALYZE mid-drain, 5,000 deliveries in 4 ranges: 3 ms of a claim; 0.3 ms as
-- arrays). No array of ids is compared with the due rows: inline, the 100 ids of `sent`
-- made the planner's work grow with the ranges (bench/delivery.py --claims-only, 4
-- ranges: 26 ms of planning per claim, 0.8 ms unpartitioned).
-- Where the dispatcher prepares the claim (the pooler allows it) it runs the claim on its
-- generic plan, without JIT (plan_cache_mode and jit set for the claim alone,
-- slawatch/delivery/dispatcher.py's _GENERIC), which
-- PostgreSQL's own choice never picks here: planned once per connection, where custom
-- plans were planned at every run (0.7 ms a claim on one range, 1.1 ms on 4, and
-- growing with the ranges). `due` reads delivery_due in its order under a LIMIT (`now`
-- only ends the range), the other index reads are equalities, and the ranges are
-- pruned at run time: the generic plan has the custom one's shape. Its estimate does
-- not (ranges not pruned at plan time, a LIMIT of unknown size): it grows with the
-- pending deliveries past jit_above_cost, and a cached plan is JIT-compiled again at
-- each run (385 ms a claim over 12,000 pending in 7 ranges): hence jit off. Server CPU
-- per 100 alerts, sequential claims of 100 over 20,000 deliveries: 2.62 -> 1.90 ms on
-- one range, 3.77 -> 2.42 on 4, 9.67 -> 2.98 on 8. (Before `sent` was matched by owner,
-- a forced generic plan took 100 ms a claim on 4 ranges.) Behind a transaction pooler
-- nothing is prepared, and the claim is planned at every run.
-- `holds`: a firing notification whose episode's resolved notice to this notifier
-- waits for it; once it is sent, the worker settles it through a claim (this statement)
-- even when the batch was short, and that claim takes the resolved notice.
-- The alert's times come back as the text receivers get (ISO 8601 in UTC written with
-- `Z`, the microseconds only when there are some: outbox.iso's form, which
-- tests/integration/test_deliver.py compares), so the worker neither parses nor formats
-- them: in Python that was an eighth of a worker's time (py-spy); here it costs about
-- 1.5 us of server CPU per alert more than sending the timestamps.
WITH sent AS (
    UPDATE slawatch.delivery d
       SET status = 'sent', sent_at = %(now)s, lease_owner = NULL, lease_expires_at = NULL,
           last_error = NULL
      FROM (SELECT id, alert_id FROM slawatch.delivery
             WHERE alert_id = ANY(%(sent_alerts)s::bigint[]) AND notifier = %(notifier)s
               AND lease_owner = %(sent_owner)s::uuid
               FOR UPDATE SKIP LOCKED) s
     WHERE d.id = s.id AND d.alert_id = s.alert_id
       AND d.alert_id = ANY(%(sent_alerts)s::bigint[])
    RETURNING d.id
), due AS (
    SELECT d.id, d.alert_id, a.rule, a.key, a.episode, a.n, a.kind, a.severity, a.deadline,
           a.due_at, a.fired_at, a.row_data
      FROM slawatch.delivery d
     CROSS JOIN LATERAL (SELECT * FROM slawatch.alert a WHERE a.id = d.alert_id OFFSET 0) a
     WHERE d.status = 'pending' AND d.notifier = %(notifier)s AND d.next_attempt_at <= %(now)s
       AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= %(now)s)
       AND coalesce(d.lease_owner <> %(sent_owner)s::uuid, true)
       AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
       AND (a.kind <> 'resolved' OR (NOT EXISTS (
            SELECT 1 FROM slawatch.alert f
             CROSS JOIN LATERAL (
                   SELECT p.id, p.status, p.lease_owner FROM slawatch.delivery p
                    WHERE p.alert_id = f.id AND p.notifier = d.notifier OFFSET 0) p
             WHERE f.rule = a.rule AND f.key = a.key AND f.episode = a.episode AND f.n > 0
               AND p.status = 'pending' AND coalesce(p.lease_owner <> %(sent_owner)s::uuid, true))
            AND (a.rule, a.key, a.episode) NOT IN (
            SELECT e.rule, e.key, e.episode FROM (
                   SELECT f.rule, unnest(f.keys) AS key, unnest(f.episodes) AS episode
                     FROM (SELECT p.row_id FROM slawatch.outbox_send p
                            WHERE p.notifier = %(notifier)s AND p.status = 'pending'
                           OFFSET 0) p
                    CROSS JOIN LATERAL (
                          SELECT f.rule, f.keys, f.episodes FROM slawatch.outbox_row f
                           WHERE f.id = p.row_id AND f.kind = 'firing' OFFSET 0) f) e
             WHERE e.key IS NOT NULL AND e.episode IS NOT NULL)))
     ORDER BY d.next_attempt_at
     LIMIT %(limit)s
       FOR UPDATE OF d SKIP LOCKED
), acked AS (
    SELECT due.id, due.alert_id FROM due
     WHERE due.kind = 'firing' AND EXISTS (
            SELECT 1 FROM slawatch.ack k
             WHERE k.rule = due.rule AND k.key = due.key AND k.episode = due.episode)
), muted AS (
    SELECT id, alert_id, 'acknowledged' AS status FROM acked
    UNION ALL
    SELECT due.id, due.alert_id, 'silenced' FROM due
     WHERE due.id NOT IN (SELECT id FROM acked)
       AND EXISTS (SELECT 1 FROM slawatch.silence s
                    WHERE s.rule = due.rule AND s.ends_at > %(now)s AND s.starts_at <= %(now)s
                      AND (s.key IS NULL OR s.key = due.key) AND due.row_data @> s.matchers)
), settled AS (
    UPDATE slawatch.delivery d
       SET status = muted.status, lease_owner = NULL, lease_expires_at = NULL
      FROM muted
     WHERE d.id = muted.id AND d.alert_id = muted.alert_id
    RETURNING d.id, d.notifier, d.attempts, muted.status AS settled
), leased AS (
    UPDATE slawatch.delivery d
       SET lease_owner = %(owner)s,
           lease_expires_at = %(now)s + %(lease)s::interval,
           attempts = d.attempts + 1
     WHERE d.alert_id = ANY(ARRAY(SELECT alert_id FROM due WHERE id NOT IN (SELECT id FROM muted)))
       AND d.notifier = %(notifier)s
       AND d.alert_id >= (SELECT min(alert_id) FROM due)
    RETURNING d.id, d.notifier, d.attempts, NULL::text AS settled
)
SELECT l.id, l.notifier, l.attempts, l.settled, a.alert_id,
       a.rule, a.key, a.episode, a.n, a.kind, a.severity,
       replace(to_char(a.deadline AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
               '.000000', '') || 'Z' AS deadline,
       replace(to_char(a.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
               '.000000', '') || 'Z' AS due_at,
       replace(to_char(a.fired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
               '.000000', '') || 'Z' AS fired_at,
       a.row_data, h.holds IS NOT NULL AS holds, NULL::bigint[] AS sent
  FROM (SELECT * FROM leased UNION ALL SELECT * FROM settled) l
  JOIN due a ON a.id = l.id
  -- LATERAL with LIMIT: a probe per row (alert_once, delivery_once), never a hash of
  -- every pending delivery, which an EXISTS may be planned as.
  LEFT JOIN LATERAL (
       SELECT true AS holds FROM slawatch.alert r
        CROSS JOIN LATERAL (
              SELECT rd.status FROM slawatch.delivery rd
               WHERE rd.alert_id = r.id AND rd.notifier = l.notifier OFFSET 0) rd
        WHERE l.settled IS NULL AND a.kind = 'firing'
          AND r.rule = a.rule AND r.key = a.key AND r.episode = a.episode AND r.n = 0
          AND rd.status = 'pending'
        LIMIT 1) h ON true
UNION ALL
SELECT NULL, %(notifier)s, NULL, 'sent', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, false, array_agg(id)
  FROM sent
HAVING count(*) > 0
 ORDER BY notifier, id;

-- deliveries_due --
-- Before a worker's first claim after it wakes: anything the claim could take, and any
-- row send a lease could take? A function (0017_deliveries_due.sql,
-- 0024_deliveries_due_by_shape.sql) so that its plan is kept, behind a pooler too.
SELECT deliveries, sends FROM slawatch.deliveries_due_by_shape(%(notifier)s, %(now)s);

-- storm_lock --
-- Every claim of a notifier with `storm` set holds this lock, in its own statement
-- first (a lock taken inside the claim's statement would come after its snapshot), so
-- that one claim at a time, in any process, counts and folds a storm: two workers
-- never each send a summary for the same alerts. Claims are milliseconds; the sends
-- between them still overlap. A hash collision only makes two notifiers take turns.
SELECT pg_advisory_xact_lock(hashtextextended('slawatch.storm:' || %(notifier)s, 0));

-- summarize_storms --
-- Under storm_lock, before the claim (slawatch/delivery/storm.py). The candidates are the
-- notifier's due first attempts of notifications ('firing': first notices and
-- re-notifications; never resolved notices or summaries), not matched by an active
-- silence or of an acknowledged episode (they win: the claim that follows settles those
-- 'silenced' or 'acknowledged', uncounted).
-- The outbox in rows (docs/explanation/outbox-rows.md) adds its sends to the notifier
-- that are due and never attempted, of firing rows: each counts by its alerts from
-- `done` on that are neither skipped already nor matched by an active silence or an ack
-- (the same two looks per alert); one with none is left to the lease, which settles it.
-- The notifier's pending sends are read through outbox_send_due (the backlog), each row
-- by its primary key (LATERAL with OFFSET 0, as lease_row_send): no rows, one probe.
-- Per rule: when a summary of the rule for this notifier is still open (pending and
-- never attempted, so every attempt of it carries the same content), every candidate
-- is folded into it, however few; otherwise, more than `threshold` candidates make a
-- new summary alert (kind 'summary', the highest severity among them, `severities`
-- naming them from the lowest up) with its own
-- delivery, due after `wait` so that the rest of the storm (the next claim batches of
-- the same drain) folds into it too. A folded delivery is settled 'summarized' and
-- points at its summary, found by (alert id, id): one range's partition per row, as the
-- claim's writes. A folded send likewise, its silenced and acknowledged alerts recorded
-- in `skipped` (as the lease records them; the others are summarized). Its key names
-- the storm's first alert: the least alert id among deliveries, else the first row's
-- first alert's id (negative, alert_by_id). No FOR UPDATE: under the lock no other claim
-- of this notifier runs, and the fold's UPDATE re-checks each row (a replay, a process
-- without the lock, or a row send's lease, which does not take it, may have changed it
-- since).
WITH candidates AS (
    SELECT d.id, d.alert_id, a.rule, a.severity
      FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id
     WHERE d.status = 'pending' AND d.notifier = %(notifier)s
       AND d.next_attempt_at <= %(now)s AND d.attempts = 0 AND a.kind = 'firing'
       AND NOT EXISTS (
            SELECT 1 FROM slawatch.silence s
             WHERE s.rule = a.rule AND s.ends_at > %(now)s AND s.starts_at <= %(now)s
               AND (s.key IS NULL OR s.key = a.key) AND a.row_data @> s.matchers)
       AND NOT EXISTS (
            SELECT 1 FROM slawatch.ack k
             WHERE k.rule = a.rule AND k.key = a.key AND k.episode = a.episode)
), row_sends AS (
    SELECT s.row_id, s.done, s.skipped, r.rule, r.keys, r.episodes, r.severities, r.row_data
      FROM slawatch.outbox_send s
     CROSS JOIN LATERAL (
           SELECT o.rule, o.keys, o.episodes, o.severities, o.row_data
             FROM slawatch.outbox_row o
            WHERE o.id = s.row_id AND o.kind = 'firing' OFFSET 0) r
     WHERE s.status = 'pending' AND s.notifier = %(notifier)s
       AND s.next_attempt_at <= %(now)s AND s.attempts = 0
), row_elements AS (
    SELECT w.row_id, w.rule, w.done, e.p, e.severity, w.skipped[e.p] AS was,
           CASE WHEN e.p <= w.done OR w.skipped[e.p] IS NOT NULL THEN w.skipped[e.p]
                WHEN EXISTS (
                     SELECT 1 FROM slawatch.ack k
                      WHERE k.rule = w.rule AND k.key = e.key AND k.episode = e.episode)
                THEN 'acknowledged'
                WHEN EXISTS (
                     SELECT 1 FROM slawatch.silence s
                      WHERE s.rule = w.rule AND s.ends_at > %(now)s AND s.starts_at <= %(now)s
                        AND (s.key IS NULL OR s.key = e.key) AND e.row_data @> s.matchers)
                THEN 'silenced' END AS skip
      FROM row_sends w
     CROSS JOIN LATERAL unnest(w.keys, w.episodes, w.severities, w.row_data)
                WITH ORDINALITY AS e(key, episode, severity, row_data, p)
), row_candidates AS (
    SELECT row_id, rule,
           count(*) FILTER (WHERE p > done AND skip IS NULL) AS count,
           -(row_id * 128 + min(p) FILTER (WHERE p > done AND skip IS NULL)) AS first_alert,
           (array_agg(severity ORDER BY array_position(%(severities)s::text[], severity)
                                           DESC NULLS LAST)
                FILTER (WHERE p > done AND skip IS NULL))[1] AS severity,
           CASE WHEN bool_or(skip IS NOT NULL) THEN array_agg(skip ORDER BY p) END AS skipped
      FROM row_elements GROUP BY row_id, rule
    HAVING count(*) FILTER (WHERE p > done AND skip IS NULL) > 0
), counted AS (
    SELECT rule, 1 AS count, alert_id AS first_alert, severity FROM candidates
    UNION ALL
    SELECT rule, count, first_alert, severity FROM row_candidates
), per_rule AS (
    SELECT rule, sum(count) AS count,
           coalesce(min(first_alert) FILTER (WHERE first_alert > 0), max(first_alert))
               AS first_alert,
           (array_agg(severity ORDER BY array_position(%(severities)s::text[], severity)
                                           DESC NULLS LAST))[1] AS severity
      FROM counted GROUP BY rule
), open AS (
    -- At most one per rule is ever open (all are made under the lock); min() for sure.
    SELECT a.rule, min(a.id) AS summary_id
      FROM slawatch.delivery sd JOIN slawatch.alert a ON a.id = sd.alert_id
     WHERE sd.status = 'pending' AND sd.notifier = %(notifier)s AND sd.attempts = 0
       AND sd.last_error IS NULL AND a.kind = 'summary'
       AND a.rule IN (SELECT rule FROM per_rule)
     GROUP BY a.rule
), made AS (
    INSERT INTO slawatch.alert (rule, key, episode, n, kind, severity, fired_at, row_data)
    SELECT p.rule, 'storm:' || %(notifier)s || ':' || p.first_alert, 0, 0, 'summary',
           p.severity, %(now)s::timestamptz,
           jsonb_build_object('notifier', %(notifier)s::text, 'count', p.count)
      FROM per_rule p
     WHERE p.count > %(threshold)s AND p.rule NOT IN (SELECT rule FROM open)
    ON CONFLICT DO NOTHING
    RETURNING id, rule
), made_deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT id, %(notifier)s, %(now)s::timestamptz + %(wait)s::interval FROM made
    RETURNING 1
), target AS (
    SELECT rule, summary_id, false AS made FROM open
    UNION ALL
    SELECT rule, id, true FROM made
), folded_deliveries AS (
    UPDATE slawatch.delivery d
       SET status = 'summarized', summary_id = t.summary_id
      FROM candidates c JOIN target t ON t.rule = c.rule
     WHERE d.id = c.id AND d.alert_id = c.alert_id AND d.attempts = 0
       -- The recheck compares with a value the planner does not see: with the literal,
       -- delivery_due qualifies for finding each row, and on the statistics of a table
       -- that a storm has just filled (before autoanalyze) the planner ANDed it with
       -- delivery_id's bitmap, reading every pending delivery for each folded one
       -- (20,000 folded: 12.5 s instead of 0.1; test_storm.py).
       AND d.status = (SELECT 'pending')
    RETURNING t.summary_id, 1::bigint AS count, c.severity
), folded_sends AS (
    UPDATE slawatch.outbox_send s
       SET status = 'summarized', summary_id = t.summary_id, skipped = c.skipped
      FROM row_candidates c JOIN target t ON t.rule = c.rule
     WHERE s.row_id = c.row_id AND s.notifier = %(notifier)s AND s.attempts = 0
       AND s.status = (SELECT 'pending')
    RETURNING t.summary_id, c.count, c.severity
), folded AS (
    SELECT * FROM folded_deliveries UNION ALL SELECT * FROM folded_sends
), folded_per AS (
    SELECT summary_id, sum(count) AS count,
           (array_agg(severity ORDER BY array_position(%(severities)s::text[], severity)
                                           DESC NULLS LAST))[1] AS severity
      FROM folded GROUP BY summary_id
), grown AS (
    -- An open summary counts what was folded into it now; a new one was written with
    -- its count (a row inserted by this statement cannot be updated by it).
    UPDATE slawatch.alert s
       SET row_data = jsonb_set(s.row_data, '{count}',
                                to_jsonb((s.row_data->>'count')::bigint + f.count)),
           severity = CASE WHEN array_position(%(severities)s::text[], f.severity)
                              > array_position(%(severities)s::text[], s.severity)
                           THEN f.severity ELSE s.severity END
      FROM folded_per f
     WHERE s.id = f.summary_id AND s.id IN (SELECT summary_id FROM open)
    RETURNING 1
)
-- (made_deliveries and grown run whether read or not, as every data-modifying CTE.)
SELECT t.rule, t.summary_id, t.made, coalesce(f.count, 0) AS folded
  FROM target t LEFT JOIN folded_per f ON f.summary_id = t.summary_id
 ORDER BY t.rule;

-- storm_listing --
-- What a summary's message lists: per summary alert, its first `listed` folded alerts
-- (claim order), through delivery_summary; and, for the link, when the first fired.
-- Then those of the outbox's rows folded into it (through outbox_send_summary), in row
-- order, each send its alerts from `done` on not skipped. `part` and `place` order them.
SELECT s.id AS summary_id, l.*
  FROM unnest(%(ids)s::bigint[]) AS s(id)
  CROSS JOIN LATERAL (
       (SELECT 0 AS part, d.alert_id AS place, a.rule, a.key, a.episode, a.n, a.kind,
               a.severity, a.deadline, a.due_at, a.fired_at, a.row_data
          FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id
         WHERE d.summary_id = s.id
         ORDER BY d.alert_id
         LIMIT %(limit)s)
       UNION ALL
       (SELECT 1, o.row_id * 128 + e.p, r.rule, e.key, e.episode, e.n, r.kind, e.severity,
               e.deadline, e.deadline + r.after, r.fired_at, e.row_data
          FROM slawatch.outbox_send o
          JOIN slawatch.outbox_row r ON r.id = o.row_id
         CROSS JOIN LATERAL unnest(r.keys, r.episodes, r.ns, r.severities, r.deadlines,
                                   r.row_data)
                    WITH ORDINALITY AS e(key, episode, n, severity, deadline, row_data, p)
         WHERE o.summary_id = s.id AND e.p > o.done AND o.skipped[e.p] IS NULL
         ORDER BY o.row_id, e.p
         LIMIT %(limit)s)
       ORDER BY 1, 2
       LIMIT %(limit)s) l
 ORDER BY s.id, l.part, l.place;

-- mark_sent --
-- Fenced: only the owner of the current lease may finish a delivery. One statement
-- settles the whole batch. The owner id is fresh per claim and every settle clears
-- it in the write that leaves 'pending', so it also says the row is still pending:
-- no `status = 'pending'` here, which let the planner scan every pending delivery
-- through delivery_due instead of probing the primary key (measured: 8 ms per 100
-- with 10 k pending, growing with the backlog; now 2 ms). The ids come as array
-- literals (dispatcher.id_array, text: a seventh of psycopg's time to adapt a list),
-- made arrays by the ::bigint[] casts; the same in mark_retry and mark_dead.
-- Asynchronous commit, as claim_deliveries: a lost 'sent' is a resend.
-- `alerts`: the deliveries' alert ids (the dispatcher has them): the rows are found
-- through delivery_once, in their id ranges' partitions only (delivery is partitioned
-- by alert_id, and its id alone has no index: 0018_lean_outbox.sql). The same in
-- mark_retry, mark_dead and claim_deliveries' `sent` (sent_alerts).
UPDATE slawatch.delivery
   SET status = 'sent', sent_at = %(now)s, lease_owner = NULL, lease_expires_at = NULL,
       last_error = NULL
 WHERE id = ANY(%(ids)s::bigint[]) AND alert_id = ANY(%(alerts)s::bigint[])
   AND lease_owner = %(owner)s
   AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off';

-- mark_retry --
-- Each delivery at its own next attempt time (its own backoff): ids[i] at nexts[i].
-- Fenced like mark_sent, and for the same reason without `status = 'pending'` (the
-- owner says it): on the statistics of a burst the recheck let delivery_due into
-- each row's lookup (tests/integration/test_storm.py checks the plan).
UPDATE slawatch.delivery d
   SET next_attempt_at = r.next_at, lease_owner = NULL, lease_expires_at = NULL,
       last_error = %(error)s
  FROM unnest(%(ids)s::bigint[], %(nexts)s::timestamptz[]) AS r(id, next_at)
 WHERE d.id = r.id AND d.alert_id = ANY(%(alerts)s::bigint[])
   AND d.lease_owner = %(owner)s;

-- mark_dead --
-- Fenced like mark_sent. Its commit stays synchronous: lost, the delivery would only be
-- pending again (leased; tried once more when the lease runs out), but a dead letter is
-- what a person is told to look at, and it is rare.
UPDATE slawatch.delivery
   SET status = 'dead', lease_owner = NULL, lease_expires_at = NULL, last_error = %(error)s
 WHERE id = ANY(%(ids)s::bigint[]) AND alert_id = ANY(%(alerts)s::bigint[])
   AND lease_owner = %(owner)s;

-- replay --
-- Dead and orphaned deliveries back to pending, as if new: each to its own notifier, or
-- with `to` to that one instead (the delivery moves; one whose alert has a delivery to
-- `to` already stays as it is: `taken`). Only to a notifier in `configured` (NULL: any):
-- one to a notifier no longer configured would only be orphaned again (`left`).
-- A replayed firing notification of an episode whose resolved notice has gone out would
-- page after the all-clear (a PagerDuty incident opened for good): the resolved notice
-- goes to the same notifier again, after it (pending; the claim holds it back until the
-- firing one is settled), unless it is pending there already. Not to a webhook action's
-- target (`action:<rule>`): an action is not a notifier, and its receiver is never sent a
-- resolved notice (its replayed delivery is the action's next attempt, nothing more).
-- A resolved notice kept in the outbox in rows goes again likewise: the statement
-- answers the firing notifications it sent again (rule, key, episode, fired_at, target:
-- `across`), which replay_row_sends, next in the same transaction, takes.
WITH picked AS (
    SELECT d.id, d.alert_id, d.status, t.target,
           (%(configured)s::text[] IS NULL OR t.target = ANY(%(configured)s::text[])) AS known,
           EXISTS (SELECT 1 FROM slawatch.delivery o
                    WHERE o.alert_id = d.alert_id AND o.notifier = t.target AND o.id <> d.id)
               AS taken,
           a.rule, a.key, a.episode, a.fired_at, a.kind
      FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id
     CROSS JOIN LATERAL (SELECT coalesce(%(to)s::text, d.notifier) AS target) t
     WHERE d.status IN ('dead', 'orphaned')
       AND (%(rule)s::text IS NULL OR a.rule = %(rule)s::text)
       AND (%(notifier)s::text IS NULL OR d.notifier = %(notifier)s::text)
), replayed AS (
    UPDATE slawatch.delivery d
       SET status = 'pending', notifier = p.target, attempts = 0, next_attempt_at = %(now)s,
           lease_owner = NULL, lease_expires_at = NULL
      FROM picked p
     WHERE d.id = p.id AND d.alert_id = p.alert_id AND d.status = p.status AND p.known
       AND NOT p.taken
    RETURNING p.status AS was, d.alert_id, p.target, p.rule, p.key, p.episode, p.fired_at, p.kind
), closing AS (
    SELECT DISTINCT r.id AS alert_id, x.target
      FROM replayed x
      JOIN slawatch.alert f ON f.id = x.alert_id AND f.kind = 'firing'
      JOIN slawatch.alert r
        ON r.rule = f.rule AND r.key = f.key AND r.episode = f.episode AND r.n = 0
     WHERE NOT starts_with(x.target, 'action:')
       AND NOT EXISTS (SELECT 1 FROM replayed y WHERE y.alert_id = r.id AND y.target = x.target)
), resent AS (
    -- (A row `replayed` moved is left out above: one statement must not write it twice.)
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT alert_id, target, %(now)s FROM closing
    ON CONFLICT ON CONSTRAINT delivery_once DO UPDATE
       SET status = 'pending', attempts = 0, next_attempt_at = excluded.next_attempt_at,
           lease_owner = NULL, lease_expires_at = NULL
     WHERE slawatch.delivery.status <> 'pending'
    RETURNING 1
), across AS (
    SELECT x.rule, x.key, x.episode, x.fired_at, x.target
      FROM replayed x
     WHERE x.kind = 'firing' AND NOT starts_with(x.target, 'action:')
)
SELECT (SELECT count(*) FROM replayed WHERE was = 'dead') AS dead,
       (SELECT count(*) FROM replayed WHERE was = 'orphaned') AS orphaned,
       (SELECT count(*) FROM picked WHERE known AND taken) AS taken,
       (SELECT count(*) FROM picked WHERE NOT known) AS left,
       (SELECT count(*) FROM resent) AS resolved,
       (SELECT coalesce(array_agg(rule), '{}') FROM across) AS across_rules,
       (SELECT coalesce(array_agg(key), '{}') FROM across) AS across_keys,
       (SELECT coalesce(array_agg(episode), '{}') FROM across) AS across_episodes,
       (SELECT coalesce(array_agg(fired_at), '{}') FROM across) AS across_fired,
       (SELECT coalesce(array_agg(target), '{}') FROM across) AS across_targets;

-- replay_leftovers --
-- Whether any dead or orphaned delivery goes to `notifier`, read through delivery_dead
-- and delivery_orphaned: a name `replay` may take though no notifier has it any more.
SELECT EXISTS (SELECT 1 FROM slawatch.delivery
                WHERE status = 'dead' AND notifier = %(notifier)s)
    OR EXISTS (SELECT 1 FROM slawatch.delivery
                WHERE status = 'orphaned' AND notifier = %(notifier)s);

-- orphans_pending --
-- Whether any pending delivery goes to a notifier not in `configured` (through
-- delivery_due): orphan_deliveries runs only then.
SELECT EXISTS (SELECT 1 FROM slawatch.delivery
                WHERE status = 'pending' AND notifier <> ALL(%(configured)s::text[]));

-- orphan_deliveries --
-- Pending deliveries to notifiers not in `configured` (removed from notifiers/) are
-- settled 'orphaned': nothing would ever send them, and a pending delivery keeps its
-- alert from being pruned. One in flight (its lease not run out at `now`) is left to
-- the process sending it, which still has that notifier; the next look settles it if
-- it comes back. `due_before` set: only those due since then (maintenance waits a
-- while: another instance may have the notifier; one whose lease ran out was due again
-- when it ran out); NULL: all of them. Read through delivery_due: the backlog, not the history.
WITH orphaned AS (
    UPDATE slawatch.delivery
       SET status = 'orphaned', lease_owner = NULL, lease_expires_at = NULL
     WHERE status = 'pending' AND notifier <> ALL(%(configured)s::text[])
       AND (%(due_before)s::timestamptz IS NULL
            OR greatest(next_attempt_at, lease_expires_at) <= %(due_before)s)
       AND (lease_owner IS NULL OR lease_expires_at <= %(now)s)
    RETURNING notifier
)
SELECT notifier, count(*) FROM orphaned GROUP BY notifier ORDER BY notifier;

-- settle_acked --
-- An acknowledged episode's firing notifications not yet sent are settled, not sent:
-- those due or waiting to retry, and one whose lease ran out (its sender died or
-- stalled: clearing the owner fences it out). One in flight is left to its sender:
-- sent, it is history; failed, the claim settles it when it is due again. Resolved
-- notices are not touched: they still go out. Through alert_once and delivery_once.
WITH settled AS (
    UPDATE slawatch.delivery d
       SET status = 'acknowledged', lease_owner = NULL, lease_expires_at = NULL
      FROM slawatch.alert a
     WHERE a.rule = %(rule)s AND a.key = %(key)s AND a.episode = %(episode)s AND a.n > 0
       AND a.kind = 'firing' AND d.alert_id = a.id AND d.status = 'pending'
       AND (d.lease_owner IS NULL OR d.lease_expires_at <= %(now)s)
    RETURNING 1
)
SELECT count(*) FROM settled;

-- wake_deliveries --
SELECT pg_notify('slawatch_delivery', '');

-- prune_episodes --
-- One bounded batch of the episode history (maintain.py): episodes that ended before the
-- cutoff, oldest first through episode_ended. An open episode is kept however old.
-- The rows are locked as they are found, passing over those locked already (SKIP
-- LOCKED), then deleted by ctid: the batch never waits for a row. A claim locks ended
-- history rows too (the outbox in rows: a given-up episode's row it ends again, and
-- the FOR KEY SHARE probe of _RESOLVED_ROWS, slawatch/engine/outbox.py), in its keys'
-- order; a DELETE that waited for those, holding rows it took in ended_at order, could
-- wait for a claim that waits for it (a deadlock, one of the two undone). A row passed
-- over goes with a later batch; those passed over do not count towards the batch size
-- (LIMIT above the lock), so a batch still comes back full while more are old.
-- The price: a lock record per row before its delete, twice the WAL of the DELETE alone
-- (measured, 5,000 of 200,000 episodes, EXPLAIN ANALYZE rolled back, PostgreSQL 15 on a
-- loaded 2-core machine: 0.56 MB instead of 0.28 MB, 4-16 ms instead of 3-7 ms a batch).
DELETE FROM slawatch.episode WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM slawatch.episode
     WHERE ended_at < %(cutoff)s AND ended_at IS NOT NULL
     ORDER BY ended_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED))
  AND ended_at < %(cutoff)s;

-- prune_ranges --
-- The alert id ranges prune_history goes through, one after the other, oldest first:
-- what history_drop leaves -- the ranges closed before the cutoff (kept past their turn:
-- retention keeps something in them) and the open range (a window shorter than a
-- rotation period). A range closed at or after the cutoff waits for its drop (its
-- alerts are kept up to one rotation period longer than the window). Before the
-- outbox is converted (alert_rotating exists) or with no range recorded: all ids.
SELECT h.low, h.high FROM slawatch.history_range h
 WHERE (h.closed_at IS NULL OR h.closed_at < %(cutoff)s)
   AND to_regclass('slawatch.alert_rotating') IS NULL
UNION ALL
SELECT '-9223372036854775808'::bigint, '9223372036854775807'::bigint
 WHERE to_regclass('slawatch.alert_rotating') IS NOT NULL
    OR NOT EXISTS (SELECT 1 FROM slawatch.history_range)
ORDER BY 1;

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
-- Acks: an ack goes with the alert it names, in the same statement, so it never
-- names a removed alert; an alert named by an ack younger than the window stays
-- until the ack is old too (one probe of ack_pkey per old alert), so an episode
-- acked late keeps its ack, which the claim reads at its next re-notification, a
-- whole window. Acks whose alert is gone already (removed before retention covered
-- acks, or by hand) go once older than the window, through ack_acked_at.
-- Silences: those that ended before the cutoff, per rule through silence_rule_ends
-- (the rules by a skip scan of it, as for alerts). Nothing refers to a silence.
-- The three parts share the batch size: each removes at most `batch` rows.
-- Id ranges (0015_rotate.sql): a batch reads one range, alert ids [lo, hi), given by
-- prune_ranges: every part that reads the outbox bounds its ids to it, so each reads
-- one partition (pruned when the statement starts) and its alert_rule_fired in order.
-- Over all kept ranges at once, the planner merged every old partition and sorted.
WITH RECURSIVE rules AS (
    SELECT min(rule) AS rule FROM slawatch.alert WHERE id >= %(lo)s AND id < %(hi)s
    UNION ALL
    SELECT (SELECT min(a.rule) FROM slawatch.alert a
             WHERE a.rule > r.rule AND a.id >= %(lo)s AND a.id < %(hi)s)
      FROM rules r
     WHERE r.rule IS NOT NULL
), old AS (
    SELECT o.id
      FROM rules r CROSS JOIN LATERAL (
            SELECT a.id FROM slawatch.alert a
             WHERE a.rule = r.rule AND a.fired_at < %(cutoff)s
               AND a.id >= %(lo)s AND a.id < %(hi)s
               AND (SELECT bool_or(p.status = 'pending') FROM slawatch.delivery p
                     WHERE p.alert_id = a.id) IS NOT TRUE
               AND (SELECT bool_or(k.acked_at >= %(cutoff)s) FROM slawatch.ack k
                     WHERE k.rule = a.rule AND k.key = a.key AND k.episode = a.episode
                       AND k.alert_id = a.id) IS NOT TRUE
             ORDER BY a.fired_at
             LIMIT %(batch)s) o
     LIMIT %(batch)s
), gone_deliveries AS (
    DELETE FROM slawatch.delivery d
     WHERE d.alert_id = ANY (ARRAY(SELECT id FROM old)) AND d.status <> 'pending'
       AND d.alert_id >= %(lo)s AND d.alert_id < %(hi)s
    RETURNING d.id
), gone_alerts AS (
    DELETE FROM slawatch.alert a
     WHERE a.id = ANY (ARRAY(SELECT id FROM old)) AND a.id >= %(lo)s AND a.id < %(hi)s
       AND (SELECT bool_and(k.id IN (SELECT g.id FROM gone_deliveries g))
              FROM slawatch.delivery k
             WHERE k.alert_id = a.id) IS NOT FALSE
    RETURNING a.id, a.rule, a.key, a.episode
), gone_acks AS (
    DELETE FROM slawatch.ack k
     USING gone_alerts g
     WHERE k.rule = g.rule AND k.key = g.key AND k.episode = g.episode AND k.alert_id = g.id
    RETURNING 1
), orphans AS (
    SELECT k.rule, k.key, k.episode FROM slawatch.ack k
     WHERE k.acked_at < %(cutoff)s
       AND NOT EXISTS (SELECT 1 FROM slawatch.alert a WHERE a.id = k.alert_id)
     ORDER BY k.acked_at
     LIMIT %(batch)s
), gone_orphans AS (
    DELETE FROM slawatch.ack k
     USING orphans o
     WHERE k.rule = o.rule AND k.key = o.key AND k.episode = o.episode
    RETURNING 1
), silence_rules AS (
    SELECT min(rule) AS rule FROM slawatch.silence
    UNION ALL
    SELECT (SELECT min(s.rule) FROM slawatch.silence s WHERE s.rule > r.rule)
      FROM silence_rules r
     WHERE r.rule IS NOT NULL
), ended AS (
    SELECT e.id
      FROM silence_rules r CROSS JOIN LATERAL (
            SELECT s.id FROM slawatch.silence s
             WHERE s.rule = r.rule AND s.ends_at < %(cutoff)s
             ORDER BY s.ends_at
             LIMIT %(batch)s) e
     LIMIT %(batch)s
), gone_silences AS (
    DELETE FROM slawatch.silence s
     WHERE s.id = ANY (ARRAY(SELECT id FROM ended)) AND s.ends_at < %(cutoff)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone_alerts), (SELECT count(*) FROM gone_deliveries),
       (SELECT count(*) FROM gone_acks), (SELECT count(*) FROM gone_orphans),
       (SELECT count(*) FROM gone_silences);

-- alert_by_id --
-- Today's alert by its id, or an alert kept as an element of the outbox's rows
-- (SLAWATCH_OUTBOX=rows, docs/explanation/outbox-rows.md). An element's numeric id is
-- -(row id * 128 + its 1-based place in the row): negative, so it never meets one of
-- today's, which are drawn from identity sequences (from 1 up; 0015_rotate.sql's id
-- ranges start at 0 and only grow), and small enough for a JSON number (a row holds 100
-- elements at most, so 128 leaves room). One probe of outbox_row's primary key.
-- An element's due_at: its own in due_ats (a calendar rule's row,
-- 0023_outbox_rows_calendar.sql), else its deadline plus the row's `after`.
SELECT id, rule, key, episode, n, kind, severity, deadline, due_at, fired_at, row_data
  FROM slawatch.alert WHERE id = %(id)s
UNION ALL
SELECT %(id)s::bigint, r.rule, r.keys[x.p], r.episodes[x.p], r.ns[x.p], r.kind,
       r.severities[x.p], r.deadlines[x.p],
       coalesce(r.due_ats[x.p], r.deadlines[x.p] + r.after), r.fired_at,
       r.row_data[x.p]
  FROM (SELECT -%(id)s::bigint / 128 AS row_id, mod(-%(id)s::bigint, 128)::int AS p) x
  JOIN slawatch.outbox_row r ON r.id = x.row_id
 WHERE %(id)s::bigint < 0 AND x.p BETWEEN 1 AND cardinality(r.ns);

-- alert_by_name --
-- The idempotency id's parts, through alert_once; or an element of the outbox's rows
-- (alert_by_id): its rule's rows fired since the episode's first notification (the
-- episode history's notified_at: the claim that wrote notification #1 wrote the row
-- of the episode with the same time), through outbox_row_fired, each tested for the
-- key. A resolved notice (n = 0) is in a row of kind 'resolved'.
SELECT id, rule, key, episode, n, kind, severity, deadline, due_at, fired_at, row_data
  FROM slawatch.alert
 WHERE rule = %(rule)s AND key = %(key)s AND episode = %(episode)s AND n = %(n)s
UNION ALL
(SELECT -(r.id * 128 + e.p), r.rule, r.keys[e.p], r.episodes[e.p], r.ns[e.p], r.kind,
        r.severities[e.p], r.deadlines[e.p],
        coalesce(r.due_ats[e.p], r.deadlines[e.p] + r.after), r.fired_at,
        r.row_data[e.p]
   FROM slawatch.outbox_row r
  CROSS JOIN LATERAL generate_subscripts(r.keys, 1) AS e(p)
  WHERE r.rule = %(rule)s AND %(key)s = ANY (r.keys)
    AND r.kind = CASE WHEN %(n)s = 0 THEN 'resolved' ELSE 'firing' END
    AND r.fired_at >= coalesce((SELECT h.notified_at FROM slawatch.episode h
                                 WHERE h.rule = %(rule)s AND h.key = %(key)s
                                   AND h.episode = %(episode)s), '-infinity')
    AND r.keys[e.p] = %(key)s AND r.episodes[e.p] = %(episode)s AND r.ns[e.p] = %(n)s
  LIMIT 1);

-- latest_alert --
-- The row's latest notification (in its latest episode), and whether `episode` has a
-- resolved notice; both through alert_once, a few index pages whatever the history.
-- The outbox's rows too (alert_by_name): the key's latest episode in the episode
-- history (episode_pkey), its notifications in the rule's rows fired since it began;
-- a resolved notice only where the history says the episode ended.
SELECT l.episode, l.n, l.kind,
       EXISTS (SELECT 1 FROM slawatch.alert r
                WHERE r.rule = %(rule)s AND r.key = %(key)s AND r.episode = %(episode)s
                  AND r.n = 0)
       OR EXISTS (SELECT 1 FROM slawatch.episode h
                    JOIN slawatch.outbox_row r
                      ON r.rule = h.rule AND r.kind = 'resolved'
                     AND r.fired_at >= h.notified_at AND h.key = ANY (r.keys)
                   CROSS JOIN LATERAL generate_subscripts(r.keys, 1) AS e(p)
                   WHERE h.rule = %(rule)s AND h.key = %(key)s AND h.episode = %(episode)s
                     AND h.ended_at IS NOT NULL
                     AND r.keys[e.p] = h.key AND r.episodes[e.p] = h.episode) AS resolved
  FROM (SELECT 1) one
  LEFT JOIN LATERAL (
       SELECT b.episode, b.n, b.kind FROM (
            (SELECT a.episode, a.n, a.kind FROM slawatch.alert a
              WHERE a.rule = %(rule)s AND a.key = %(key)s
              ORDER BY a.episode DESC, a.n DESC
              LIMIT 1)
            UNION ALL
            (SELECT r.episodes[e.p], r.ns[e.p], r.kind
               FROM (SELECT h.episode, h.notified_at FROM slawatch.episode h
                      WHERE h.rule = %(rule)s AND h.key = %(key)s
                      ORDER BY h.episode DESC
                      LIMIT 1) h
               JOIN slawatch.outbox_row r
                 ON r.rule = %(rule)s AND r.fired_at >= h.notified_at AND %(key)s = ANY (r.keys)
              CROSS JOIN LATERAL generate_subscripts(r.keys, 1) AS e(p)
              WHERE r.keys[e.p] = %(key)s AND r.episodes[e.p] = h.episode
              ORDER BY 1 DESC, 2 DESC
              LIMIT 1)) b
        ORDER BY b.episode DESC, b.n DESC
        LIMIT 1) l ON true;

-- add_ack --
-- The first ack of an episode is kept; a second one returns nothing (see get_ack).
INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by, comment)
VALUES (%(rule)s, %(key)s, %(episode)s, %(alert_id)s, %(now)s, %(by)s, %(comment)s)
ON CONFLICT (rule, key, episode) DO NOTHING
RETURNING acked_at, acked_by, comment;

-- history_ack --
-- The episode history (0006_episode_history.sql) keeps the first ack of each episode.
UPDATE slawatch.episode SET acked_at = %(now)s, acked_by = %(by)s
 WHERE rule = %(rule)s AND key = %(key)s AND episode = %(episode)s AND acked_at IS NULL;

-- get_ack --
SELECT acked_at, acked_by, comment FROM slawatch.ack
 WHERE rule = %(rule)s AND key = %(key)s AND episode = %(episode)s;

-- add_silence --
INSERT INTO slawatch.silence (rule, key, matchers, starts_at, ends_at, created_at, author,
                              comment)
VALUES (%(rule)s, %(key)s, %(matchers)s, %(now)s, %(until)s, %(now)s, %(author)s, %(comment)s)
RETURNING id, rule, key, matchers, starts_at, ends_at, created_at, author, comment;

-- list_silences --
-- Active at `now` (the application clock), or every one with `all`.
SELECT id, rule, key, matchers, starts_at, ends_at, created_at, author, comment
  FROM slawatch.silence
 WHERE %(all)s OR (starts_at <= %(now)s AND ends_at > %(now)s)
 ORDER BY id;

-- end_silence --
-- Deleting a silence ends it now; one that ended already keeps its end.
UPDATE slawatch.silence SET ends_at = LEAST(ends_at, %(now)s)
 WHERE id = %(id)s
RETURNING id, rule, key, matchers, starts_at, ends_at, created_at, author, comment;

-- record_scan --
-- The last scan of a rule (slawatch/runtime/scans.py): one small row per rule, overwritten.
INSERT INTO slawatch.scan AS s (rule, last_at, duration_ms, claimed, error)
VALUES (%(rule)s, %(at)s, %(duration_ms)s, %(claimed)s, %(error)s)
ON CONFLICT (rule) DO UPDATE
   SET last_at = excluded.last_at, duration_ms = excluded.duration_ms,
       claimed = excluded.claimed, error = excluded.error;

-- record_scans --
-- The scans of nothing of a step's rules (slawatch/runtime/scans.py): record_scan's rows,
-- for several rules in one statement.
INSERT INTO slawatch.scan AS s (rule, last_at, duration_ms, claimed, error)
SELECT r.rule, r.at, r.duration_ms, 0, NULL
  FROM unnest(%(rules)s::text[], %(at)s::timestamptz[], %(duration_ms)s::int[])
       AS r(rule, at, duration_ms)
ON CONFLICT (rule) DO UPDATE
   SET last_at = excluded.last_at, duration_ms = excluded.duration_ms,
       claimed = excluded.claimed, error = excluded.error;

-- record_scanner --
-- When this process last scanned each of its rules (slawatch/runtime/scans.py): its one
-- row, and the rows of processes gone for a day (a crash leaves its row) removed.
WITH gone AS (
    DELETE FROM slawatch.scanner WHERE at < %(at)s::timestamptz - interval '1 day'
)
INSERT INTO slawatch.scanner AS s (instance, at, scans)
VALUES (%(instance)s, %(at)s, %(scans)s)
ON CONFLICT (instance) DO UPDATE SET at = excluded.at, scans = excluded.scans;

-- last_scans --
-- The last scan recorded, at the time of the latest scan any process ran since (an
-- idle scan is recorded in slawatch.scanner only).
SELECT s.rule, GREATEST(s.last_at, h.last_at), s.duration_ms, s.claimed, s.error
  FROM slawatch.scan s
  LEFT JOIN (SELECT e.key AS rule, max(e.value::timestamptz) AS last_at
               FROM slawatch.scanner r, jsonb_each_text(r.scans) e
              GROUP BY e.key) h ON h.rule = s.rule;

-- abandoned_episodes --
-- Per rule: episodes ended as abandoned (give_up_after) still in the history, through
-- the partial index episode_abandoned.
SELECT rule, count(*) FROM slawatch.episode WHERE abandoned GROUP BY rule;

-- delivery_backlog --
-- Per rule: pending deliveries (through delivery_due) with the fired_at of the oldest
-- one's alert, dead deliveries (through delivery_dead) and orphaned ones (through
-- delivery_orphaned); sent history is not read.
-- The outbox's rows (docs/explanation/outbox-rows.md) add, per send not settled
-- (through outbox_send_due, outbox_send_dead), its elements from `done` on that were
-- not settled unsent (`skipped`): one delivery each, in the send's status. Each send's
-- row is a probe of its primary key (LATERAL with OFFSET 0: never a hash of every row
-- kept), so the cost is the backlog's.
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
), orphaned AS (
    SELECT a.rule, count(*) AS orphaned
      FROM slawatch.delivery d JOIN slawatch.alert a ON a.id = d.alert_id
     WHERE d.status = 'orphaned'
     GROUP BY a.rule
), sends AS (
    SELECT s.row_id, s.status, s.done, s.skipped FROM slawatch.outbox_send s
     WHERE s.status = 'pending'
    UNION ALL
    SELECT s.row_id, s.status, s.done, s.skipped FROM slawatch.outbox_send s
     WHERE s.status IN ('dead', 'orphaned')
), in_rows AS (
    SELECT r.rule, sum(u.n) FILTER (WHERE s.status = 'pending') AS pending,
           sum(u.n) FILTER (WHERE s.status = 'dead') AS dead,
           min(r.fired_at) FILTER (WHERE s.status = 'pending' AND u.n > 0) AS oldest,
           sum(u.n) FILTER (WHERE s.status = 'orphaned') AS orphaned
      FROM sends s
     CROSS JOIN LATERAL (
           SELECT o.rule, o.fired_at, cardinality(o.ns) AS size FROM slawatch.outbox_row o
            WHERE o.id = s.row_id OFFSET 0) r
     CROSS JOIN LATERAL (
           SELECT count(*) AS n FROM generate_series(s.done + 1, r.size) AS e(p)
            WHERE s.skipped[e.p] IS NULL) u
     GROUP BY r.rule
)
SELECT rule, sum(pending)::bigint, sum(dead)::bigint, min(oldest), sum(orphaned)::bigint
  FROM (SELECT rule, COALESCE(p.pending, 0) AS pending, COALESCE(x.dead, 0) AS dead,
               p.oldest, COALESCE(o.orphaned, 0) AS orphaned
          FROM pending p FULL JOIN dead x USING (rule) FULL JOIN orphaned o USING (rule)
        UNION ALL
        SELECT rule, COALESCE(pending, 0), COALESCE(dead, 0), oldest, COALESCE(orphaned, 0)
          FROM in_rows) b
 GROUP BY rule;

-- list_alerts --
-- Newest first, a page at a time: `before` is the last id of the previous page (keyset
-- pagination: a page costs the same however deep it is). A filter left NULL is off;
-- the plan is made for the values given (no prepared statements), so a NULL filter
-- costs nothing. `status`: alerts with at least one delivery in that status.
-- Two branches, each its own page: the elements of the outbox's rows (their ids are
-- negative, alert_by_id) newest row first, then today's alerts: the order is the
-- elements by row id and place, descending, then today's by id, descending. A
-- negative `before` is in the first part (today's follow whole), a positive one in the
-- second (no element follows). An element's status per notifier: deliveries_of.
SELECT b.id, b.rule, b.key, b.episode, b.n, b.kind, b.severity, b.deadline, b.due_at,
       b.fired_at, b.row_data
  FROM (
    (SELECT a.id, a.rule, a.key, a.episode, a.n, a.kind, a.severity, a.deadline, a.due_at,
            a.fired_at, a.row_data
       FROM slawatch.alert a
      WHERE (%(rule)s::text IS NULL OR a.rule = %(rule)s::text)
        AND (%(since)s::timestamptz IS NULL OR a.fired_at >= %(since)s::timestamptz)
        AND (%(before)s::bigint IS NULL OR %(before)s::bigint < 0 OR a.id < %(before)s::bigint)
        AND (%(status)s::text IS NULL OR EXISTS (
                 SELECT 1 FROM slawatch.delivery d
                  WHERE d.alert_id = a.id AND d.status = %(status)s::text))
      ORDER BY a.id DESC
      LIMIT %(limit)s)
    UNION ALL
    (SELECT -(r.id * 128 + e.p), r.rule, r.keys[e.p], r.episodes[e.p], r.ns[e.p], r.kind,
            r.severities[e.p], r.deadlines[e.p],
            coalesce(r.due_ats[e.p], r.deadlines[e.p] + r.after), r.fired_at,
            r.row_data[e.p]
       FROM slawatch.outbox_row r
      CROSS JOIN LATERAL generate_series(cardinality(r.ns), 1, -1) AS e(p)
      WHERE (%(rule)s::text IS NULL OR r.rule = %(rule)s::text)
        AND (%(since)s::timestamptz IS NULL OR r.fired_at >= %(since)s::timestamptz)
        AND (%(before)s::bigint IS NULL
             OR (%(before)s::bigint < 0 AND r.id <= -%(before)s::bigint / 128
                 AND -(r.id * 128 + e.p) > %(before)s::bigint))
        AND (%(status)s::text IS NULL OR EXISTS (
                 SELECT 1 FROM slawatch.outbox_send s
                  WHERE s.row_id = r.id
                    AND CASE WHEN s.skipped[e.p] IS NOT NULL THEN s.skipped[e.p]
                             WHEN s.status = 'sent' OR e.p <= s.done THEN 'sent'
                             ELSE s.status END = %(status)s::text))
      ORDER BY r.id DESC, e.p DESC
      LIMIT %(limit)s)) b
 ORDER BY b.id > 0, abs(b.id) DESC
 LIMIT %(limit)s;

-- deliveries_of --
-- A leased delivery's next attempt is when its lease runs out (if it is not settled by
-- then); the lease does not move next_attempt_at (see claim_deliveries).
-- An element of the outbox's rows (a negative id, alert_by_id) has one delivery per send
-- of its row, with the element's id as its id (a send has none of its own) and the
-- element's status: what `skipped` says it was settled as ('acknowledged',
-- 'silenced'), else sent when the send is sent or got past it (`done`), else the
-- send's (pending, dead, orphaned, summarized: its summary_id the send's); its attempts
-- and error are the send's.
SELECT alert_id, id, notifier, status, attempts, next_attempt_at, last_error, sent_at, summary_id
  FROM (
    SELECT alert_id, id, notifier, status, attempts,
           greatest(next_attempt_at, lease_expires_at) AS next_attempt_at, last_error, sent_at,
           summary_id
      FROM slawatch.delivery
     WHERE alert_id = ANY(%(ids)s::bigint[])
    UNION ALL
    SELECT w.id, w.id, s.notifier, st.status, s.attempts,
           greatest(s.next_attempt_at, s.lease_expires_at),
           CASE WHEN st.status <> 'sent' THEN s.last_error END,
           CASE WHEN st.status = 'sent' THEN s.sent_at END,
           CASE WHEN st.status = 'summarized' THEN s.summary_id END
      FROM unnest(%(ids)s::bigint[]) AS w(id)
      JOIN slawatch.outbox_send s ON s.row_id = -w.id / 128
     CROSS JOIN LATERAL (SELECT mod(-w.id, 128)::int AS p) e
     CROSS JOIN LATERAL (
           SELECT CASE WHEN s.skipped[e.p] IS NOT NULL THEN s.skipped[e.p]
                       WHEN s.status = 'sent' OR e.p <= s.done THEN 'sent'
                       ELSE s.status END AS status) st
     WHERE w.id < 0) d
 ORDER BY alert_id, notifier;

-- stats_alerts --
-- The whole kept history (SLAWATCH_RETENTION bounds it), today's alerts and the
-- elements of the outbox's rows.
SELECT rule, severity, sum(n)::bigint
  FROM (SELECT rule, severity, count(*) AS n FROM slawatch.alert GROUP BY rule, severity
        UNION ALL
        SELECT r.rule, v.severity, count(*)
          FROM slawatch.outbox_row r CROSS JOIN LATERAL unnest(r.severities) AS v(severity)
         GROUP BY r.rule, v.severity) c
 GROUP BY rule, severity ORDER BY rule, severity;

-- stats_deliveries --
-- The rows' sends count one delivery per element, in the element's status (deliveries_of).
SELECT notifier, status, sum(n)::bigint
  FROM (SELECT notifier, status, count(*) AS n FROM slawatch.delivery GROUP BY notifier, status
        UNION ALL
        SELECT s.notifier,
               CASE WHEN s.skipped[e.p] IS NOT NULL THEN s.skipped[e.p]
                    WHEN s.status = 'sent' OR e.p <= s.done THEN 'sent'
                    ELSE s.status END,
               count(*)
          FROM slawatch.outbox_send s JOIN slawatch.outbox_row r ON r.id = s.row_id
         CROSS JOIN LATERAL generate_series(1, cardinality(r.ns)) AS e(p)
         GROUP BY 1, 2) c
 GROUP BY notifier, status ORDER BY notifier, status;

-- outbox_gauges --
-- Per notifier: deliveries pending (due, leased or waiting to retry), when the alert of
-- the oldest of them fired, and deliveries dead; read at each metrics scrape. Pending
-- ones are read through delivery_due, dead ones through delivery_dead: the cost is the
-- backlog's, not the history's. Alert ids follow claim order, so the least alert id is
-- the oldest alert without joining every pending delivery to its alert.
-- The outbox's rows add their sends pending (outbox_send_due) and dead
-- (outbox_send_dead): each the elements from `done` on not settled unsent, and the
-- oldest pending row's fired_at; each row a probe of its primary key (delivery_backlog).
WITH pending AS (
    SELECT notifier, count(*) AS pending, min(alert_id) AS oldest
      FROM slawatch.delivery WHERE status = 'pending' GROUP BY notifier
), dead AS (
    SELECT notifier, count(*) AS dead
      FROM slawatch.delivery WHERE status = 'dead' GROUP BY notifier
), sends AS (
    SELECT s.row_id, s.notifier, s.status, s.done, s.skipped FROM slawatch.outbox_send s
     WHERE s.status = 'pending'
    UNION ALL
    SELECT s.row_id, s.notifier, s.status, s.done, s.skipped FROM slawatch.outbox_send s
     WHERE s.status = 'dead'
), in_rows AS (
    SELECT s.notifier, sum(u.n) FILTER (WHERE s.status = 'pending') AS pending,
           min(r.fired_at) FILTER (WHERE s.status = 'pending' AND u.n > 0) AS oldest_fired_at,
           sum(u.n) FILTER (WHERE s.status = 'dead') AS dead
      FROM sends s
     CROSS JOIN LATERAL (
           SELECT o.rule, o.fired_at, cardinality(o.ns) AS size FROM slawatch.outbox_row o
            WHERE o.id = s.row_id OFFSET 0) r
     CROSS JOIN LATERAL (
           SELECT count(*) AS n FROM generate_series(s.done + 1, r.size) AS e(p)
            WHERE s.skipped[e.p] IS NULL) u
     GROUP BY s.notifier
)
SELECT notifier, sum(pending)::bigint AS pending, min(oldest_fired_at) AS oldest_fired_at,
       sum(dead)::bigint AS dead
  FROM (SELECT coalesce(p.notifier, d.notifier) AS notifier,
               coalesce(p.pending, 0) AS pending, a.fired_at AS oldest_fired_at,
               coalesce(d.dead, 0) AS dead
          FROM pending p FULL JOIN dead d ON d.notifier = p.notifier
          LEFT JOIN slawatch.alert a ON a.id = p.oldest
        UNION ALL
        SELECT notifier, coalesce(pending, 0), oldest_fired_at, coalesce(dead, 0)
          FROM in_rows) b
 GROUP BY notifier;

-- alerts_per_hour --
-- The on-call page's chart: per rule, firing alerts by hour from `start` (on the hour)
-- to `end`, read through alert_rule_fired (one range per rule: the last day's alerts,
-- not the history). Each rule stops at `cap` alerts, so a storm costs a bounded read;
-- the caller sees a rule that reached it. `hour` is 0 for the hour beginning at `start`.
-- The outbox's rows the same way through outbox_row_fired, each row its elements' count
-- (at most `cap` rows read a rule).
SELECT rule, hour, sum(n)::bigint
  FROM (SELECT r.rule, h.hour, count(*) AS n
          FROM unnest(%(rules)s::text[]) AS r(rule)
         CROSS JOIN LATERAL (
               SELECT floor(extract(epoch FROM a.fired_at - %(start)s::timestamptz) / 3600)::int
                      AS hour
                 FROM slawatch.alert a
                WHERE a.rule = r.rule AND a.fired_at >= %(start)s::timestamptz
                  AND a.fired_at < %(end)s::timestamptz AND a.kind = 'firing'
                LIMIT %(cap)s) h
         GROUP BY r.rule, h.hour
        UNION ALL
        SELECT r.rule, h.hour, sum(h.n)
          FROM unnest(%(rules)s::text[]) AS r(rule)
         CROSS JOIN LATERAL (
               SELECT floor(extract(epoch FROM o.fired_at - %(start)s::timestamptz) / 3600)::int
                      AS hour, cardinality(o.ns) AS n
                 FROM slawatch.outbox_row o
                WHERE o.rule = r.rule AND o.fired_at >= %(start)s::timestamptz
                  AND o.fired_at < %(end)s::timestamptz AND o.kind = 'firing'
                LIMIT %(cap)s) h
         GROUP BY r.rule, h.hour) c
 GROUP BY rule, hour;

-- acks_of --
-- The acks of the episodes given as parallel arrays, through ack's primary key.
SELECT k.rule, k.key, k.episode, k.acked_by, k.acked_at
  FROM unnest(%(rules)s::text[], %(keys)s::text[], %(episodes)s::int[]) AS w(rule, key, episode)
  JOIN slawatch.ack k ON k.rule = w.rule AND k.key = w.key AND k.episode = w.episode;

-- schema_version_create --
-- Versioned migrations (slawatch/engine/schema.py): where each one applied is recorded.
-- The migrator makes it, under its lock, in the transaction of the first migration it
-- applies; it is the migrator's own record, not part of any migration.
CREATE SCHEMA IF NOT EXISTS slawatch;
CREATE TABLE IF NOT EXISTS slawatch.schema_version (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL
);

-- schema_versioned --
SELECT to_regclass('slawatch.schema_version') IS NOT NULL

-- schema_has_tables --
-- Tables of a release from before versioning: any table its schema.sql made.
SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'slawatch' AND c.relkind IN ('r', 'p')
                  AND c.relname IN ('alert', 'delivery', 'watermark', 'ack', 'silence',
                                    'scan', 'baseline'))

-- schema_versions --
SELECT version FROM slawatch.schema_version ORDER BY version

-- schema_version_recorded --
SELECT EXISTS (SELECT 1 FROM slawatch.schema_version WHERE version = %(version)s)

-- schema_version_record --
INSERT INTO slawatch.schema_version (version, name, applied_at)
VALUES (%(version)s, %(name)s, %(at)s)

-- migrate_lock_try --
-- One migrator at a time (schema.migrate_lock; the key is schema.MIGRATE_LOCK).
SELECT pg_try_advisory_lock(%(key)s)

-- migrate_unlock --
SELECT pg_advisory_unlock(%(key)s)

-- open_session --
-- A page login (slawatch/operate/session.py): the new session, and at most `prune` expired
-- ones removed on the way (oldest first, through session_expires), so the table
-- holds about the live sessions without a job of its own.
WITH expired AS (
    DELETE FROM slawatch.session
     WHERE id_hash IN (SELECT id_hash FROM slawatch.session
                        WHERE expires_at <= %(now)s ORDER BY expires_at LIMIT %(prune)s)
)
INSERT INTO slawatch.session (id_hash, created_at, expires_at)
VALUES (%(id)s, %(now)s, %(expires)s);

-- session_valid --
SELECT EXISTS (SELECT 1 FROM slawatch.session WHERE id_hash = %(id)s AND expires_at > %(now)s);

-- close_session --
DELETE FROM slawatch.session WHERE id_hash = %(id)s;

-- update_triggers --
-- What an UPDATE of the table `oid` (and of its partitions, through it) that sets only
-- the `tracking` columns fires (catalog.update_side_effects): enabled triggers on UPDATE,
-- per row or per statement; an `UPDATE OF` trigger only when it lists one of `tracking`.
-- Not the internal ones: foreign keys' checks skip an update that leaves the key as it
-- was. A partition's clone of its parent's trigger has the parent's name (internal
-- before PostgreSQL 15): one row per name, the table's own first.
WITH rels AS (
    SELECT %(oid)s::oid AS oid UNION SELECT relid::oid FROM pg_partition_tree(%(oid)s::oid)
)
SELECT DISTINCT ON (t.tgname) t.tgname, n.nspname, c.relname, c.oid = %(oid)s::oid,
       t.tgtype::integer, t.tgconstraint <> 0
  FROM pg_trigger t
  JOIN rels r ON r.oid = t.tgrelid
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE NOT t.tgisinternal AND t.tgenabled <> 'D' AND t.tgtype & 16 <> 0
   AND (cardinality(t.tgattr::int2[]) = 0
        OR EXISTS (SELECT 1 FROM unnest(t.tgattr::int2[]) AS k(attnum)
                     JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = k.attnum
                    WHERE a.attname = ANY (%(tracking)s::text[])))
 ORDER BY t.tgname, c.oid = %(oid)s::oid DESC, n.nspname, c.relname;

-- update_rules --
-- Rewrite rules ON UPDATE of the table `oid` (ev_type 2); they apply to the statement's
-- target only, so a partition's rules do not run for an UPDATE of its parent.
SELECT rulename, is_instead FROM pg_rewrite
 WHERE ev_class = %(oid)s::oid AND ev_type = '2' AND ev_enabled <> 'D'
 ORDER BY rulename;

-- update_publications --
-- Publications of the updates of the table `oid` or of a partition of it (a partition
-- is listed itself unless publish_via_partition_root): logical replication would ship
-- every claimed row to their subscribers.
SELECT DISTINCT p.pubname FROM pg_publication p
  JOIN pg_publication_tables pt ON pt.pubname = p.pubname
  JOIN pg_namespace n ON n.nspname = pt.schemaname
  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
 WHERE p.pubupdate
   AND (c.oid = %(oid)s::oid
        OR c.oid IN (SELECT relid::oid FROM pg_partition_tree(%(oid)s::oid)))
 ORDER BY p.pubname;

-- no_statistics --
-- The table `schema`.`name`, or each partition of it, that the planner has no statistics
-- for: never analyzed nor vacuumed (reltuples < 0, PostgreSQL 14 on), or no column
-- statistics (pg_stats: what ANALYZE writes; an index build counts rows but writes
-- none), or none for one of `columns` (columns added since the last ANALYZE, e.g. the
-- inline claim's tracking columns: a column that does not exist yet has none either).
-- migrate ANALYZEs the ones that hold rows once it built an index on them.
WITH rels AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = %(schema)s AND c.relname = %(name)s
)
SELECT n.nspname, c.relname
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r'
   AND (c.oid IN (SELECT oid FROM rels)
        OR c.oid IN (SELECT relid::oid FROM rels, pg_partition_tree(rels.oid)))
   AND (c.reltuples < 0
        OR NOT EXISTS (SELECT 1 FROM pg_stats s
                        WHERE s.schemaname = n.nspname AND s.tablename = c.relname)
        OR EXISTS (SELECT 1 FROM unnest(%(columns)s::text[]) AS w(col)
                    WHERE NOT EXISTS (SELECT 1 FROM pg_stats s
                                       WHERE s.schemaname = n.nspname
                                         AND s.tablename = c.relname AND s.attname = w.col)))
 ORDER BY n.nspname, c.relname;

-- indexes_on_columns --
-- The indexes of the table `schema`.`name` that read one of `columns` (as a key, in an
-- expression or in the predicate: PostgreSQL records each as a dependency); they go
-- when the columns are dropped.
SELECT DISTINCT i.relname
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = x.indexrelid
                  AND d.refclassid = 'pg_class'::regclass AND d.refobjid = x.indrelid
  JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = d.refobjsubid
 WHERE x.indrelid = (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      WHERE n.nspname = %(schema)s AND c.relname = %(name)s)
   AND a.attname = ANY (%(columns)s::text[])
 ORDER BY i.relname;

-- ---------------------------------------------------------------------------------------
-- The outbox in rows: delivery (0020_outbox_rows.sql; docs/explanation/outbox-rows.md).
-- The workers of a notifier drain its outbox_send rows beside its deliveries
-- (slawatch/delivery/dispatcher.py, deliver_rows): one send (one row's alerts to one
-- notifier) leased at a time per worker, sent in chunks of the notifier's batch from
-- `done` on, its progress recorded after each accepted chunk, settled by the statement
-- that leases the next one.

-- lease_row_send --
-- One due send of `notifier`, leased to a fresh owner (FOR UPDATE SKIP LOCKED: workers
-- and processes share the sends). Due: pending, next_attempt_at come, not leased or its
-- lease run out (the send of a worker that died is taken over). The lease writes
-- lease_owner, lease_expires_at and attempts only, which no index covers: a HOT update.
-- `sent_row`, leased to `sent_owner`: the send the worker just finished, settled 'sent'
-- here with its final `done` and `skipped` (fenced by the owner, as mark_sent; SKIP
-- LOCKED as claim_deliveries' `sent`, so two leases never wait for each other: the
-- worker settles what this skipped with mark_row_sent); NULL on a first lease. What is
-- leased to `sent_owner` is not due here: its lease may have run out mid-send, and one
-- statement must not both settle and lease the same row.
-- Per-episode order: a resolved row's send is not due while a pending send to the same
-- notifier (due, in flight or waiting to retry) of a firing row of the same rule with a
-- lower id shares a key with it (keys && keys), nor while a firing notification of one
-- of its episodes in today's outbox (slawatch.delivery) is pending to that notifier
-- (the setting switched from 'alerts' to 'rows' mid-episode). The first look reads the
-- notifier's pending sends (outbox_send_due, each row by its primary key; OFFSET 0 keeps
-- it so: as a join the planner read every row of the history for the shared key): the
-- backlog, not the history; the second probes alert_once and delivery_once per element
-- of a resolved row. A held resolved send is looked at again by every lease of its
-- notifier until its firing rows' sends are settled, as claim_deliveries does.
-- The answer: one line, the leased row's arrays from element `done` + 1 on (slices),
-- which the worker zips into payloads (outbox.row_payloads), the times as text in the
-- claim's form (claim_deliveries; an array each, in the elements' order); and `skips`
-- per element: 'acknowledged' for a firing alert whose episode is acked, 'silenced'
-- where an active silence matches (as claim_deliveries decides), else NULL; all of it
-- NULL, without a probe per element, where the rule has no ack (a firing row) and no
-- active silence: one probe of ack's primary key and one of silence_rule_ends per
-- lease. A line per element cost the worker a dict per element to decode and copy,
-- and the server a sort of the lines (bench/delivery_shapes.py, "B100, the row's arrays";
-- docs/performance.md). The elements' row_data come as one json array (array_to_json:
-- each element's jsonb text as it is), decoded by one call of the worker's loader: as
-- a jsonb[] the server escaped every quote of every element and the worker parsed the
-- array and decoded each element (measured per row of 100: 0.3 ms of server CPU and
-- 0.17 ms of Python, against 0.1 and 0.09). `settled`: whether `sent_row` was settled.
-- A line of NULLs with `settled` when nothing was leased.
-- Its commit is asynchronous, as claim_deliveries' (set in `due`, an InitPlan every
-- lease runs): a lease or a 'sent' a crash of the server loses only sends the row
-- again. The statement is the function slawatch.lease_row_send
-- (0025_lease_row_send.sql), whose arguments are the parameters above: PL/pgSQL plans
-- it once per server session on its generic plan without JIT (the function's own
-- settings), pooled or not. Planning was 0.85 ms of the lease's 1.6 ms of server CPU;
-- the plan is the custom one (`due` reads outbox_send_due in its order under LIMIT 1,
-- the rest finds its rows by primary key; a table of a few pages may be read whole, and
-- an ANALYZE makes the plan again). As a statement prepared by the dispatcher it needed
-- a set_config of plan_cache_mode and jit sent with each lease, and behind a
-- transaction pooler it was planned at every lease.
SELECT * FROM slawatch.lease_row_send(%(notifier)s::text, %(now)s::timestamptz,
    %(owner)s::uuid, %(lease)s::interval, %(sent_row)s::bigint, %(sent_owner)s::uuid,
    %(sent_done)s::integer, %(sent_skipped)s::text[]);

-- row_send_progress --
-- A chunk of a leased send accepted: the elements settled so far (`done`, `skipped` up to
-- it), and the lease renewed for the next chunk. Fenced by the owner (mark_sent): a
-- worker whose lease was taken over changes nothing, and is told so (no row back).
-- Asynchronous commit, as mark_sent: a lost progress is a chunk sent again.
UPDATE slawatch.outbox_send
   SET done = %(done)s, skipped = %(skipped)s::text[],
       lease_expires_at = %(now)s + %(lease)s::interval
 WHERE row_id = %(row_id)s AND notifier = %(notifier)s AND lease_owner = %(owner)s
   AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
RETURNING 1;

-- mark_row_sent --
-- A leased send's last chunk accepted (or nothing left to send): settled, fenced by the
-- owner, where lease_row_send could not settle it (it was locked for a moment, or no
-- lease followed).
UPDATE slawatch.outbox_send
   SET status = 'sent', sent_at = %(now)s, done = %(done)s, skipped = %(skipped)s::text[],
       lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
 WHERE row_id = %(row_id)s AND notifier = %(notifier)s AND lease_owner = %(owner)s
   AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off';

-- mark_row_retry --
-- A chunk failed: the send is tried again at `next` from `done` (recorded by the last
-- accepted chunk), with the error kept. Fenced by the owner.
UPDATE slawatch.outbox_send
   SET next_attempt_at = %(next)s, lease_owner = NULL, lease_expires_at = NULL,
       last_error = %(error)s
 WHERE row_id = %(row_id)s AND notifier = %(notifier)s AND lease_owner = %(owner)s;

-- mark_row_dead --
-- After the last attempt, or at once on a permanent failure. Fenced by the owner; its
-- commit stays synchronous (mark_dead).
UPDATE slawatch.outbox_send
   SET status = 'dead', lease_owner = NULL, lease_expires_at = NULL, last_error = %(error)s
 WHERE row_id = %(row_id)s AND notifier = %(notifier)s AND lease_owner = %(owner)s;

-- row_orphans_pending --
-- Whether any pending send goes to a notifier not in `configured` (orphans_pending).
SELECT EXISTS (SELECT 1 FROM slawatch.outbox_send
                WHERE status = 'pending' AND notifier <> ALL(%(configured)s::text[]));

-- orphan_row_sends --
-- Pending sends to notifiers not in `configured`, settled 'orphaned', as
-- orphan_deliveries does for deliveries (one in flight is left to its process).
-- Counted as the page and `slawatch status` count them (delivery_backlog): one delivery
-- per alert the send still owes, its elements from `done` on not settled unsent; each
-- send's row a probe of its primary key.
WITH orphaned AS (
    UPDATE slawatch.outbox_send
       SET status = 'orphaned', lease_owner = NULL, lease_expires_at = NULL
     WHERE status = 'pending' AND notifier <> ALL(%(configured)s::text[])
       AND (%(due_before)s::timestamptz IS NULL
            OR greatest(next_attempt_at, lease_expires_at) <= %(due_before)s)
       AND (lease_owner IS NULL OR lease_expires_at <= %(now)s)
    RETURNING notifier, row_id, done, skipped
)
SELECT o.notifier, count(*)
  FROM orphaned o
 CROSS JOIN LATERAL (
       SELECT cardinality(r.ns) AS size FROM slawatch.outbox_row r
        WHERE r.id = o.row_id OFFSET 0) r
 CROSS JOIN LATERAL generate_series(o.done + 1, r.size) AS e(p)
 WHERE o.skipped[e.p] IS NULL
 GROUP BY o.notifier ORDER BY o.notifier;

-- replay_row_sends --
-- Dead and orphaned sends back to pending, as replay does for deliveries: each to its own
-- notifier (from its `done` on: what was accepted is not sent again), or with `to` to
-- that one instead (the send moves and starts from its first element; a row with a send
-- to `to` already keeps it as it is: `taken`); only to a notifier in `configured` (NULL:
-- any), else `left`. Through outbox_send_dead.
-- A replayed firing row would page after the all-clear where a resolved row of one of
-- the episodes it sends again (its alerts from `done` on not skipped; all of them when
-- it moves) has gone out to that notifier: that resolved row's send goes back to pending
-- too (from its first alert; a new send where the row had none to the notifier, as
-- replay inserts a delivery), after it (lease_row_send holds it back until the firing
-- row's send is settled), unless it is pending there already: `resolved`, as replay's.
-- A resolved row holds up to 100 episodes' notices: the others go again too, with the
-- same idempotency ids (receivers drop a repeat). The resolved rows are found among the
-- rule's rows fired since the firing one (outbox_row_fired) that share a key with it.
-- Across shapes (a process switched SLAWATCH_OUTBOX mid-episode), the same: a resolved
-- row of an episode whose firing notification of today's outbox `replay` sent again
-- (`across_*`, its answer, in this transaction) goes back to pending to that notifier,
-- found among the rule's resolved rows fired since the earliest of those alerts
-- (outbox_row_fired; across_by); and a resolved notice in today's outbox
-- (alert_once, n = 0) of an episode a replayed firing row sends again gets its
-- delivery to that notifier back to pending (or a new one), as `replay` does it:
-- `resolved` too. Each waits for its firing notification in the other shape
-- (claim_deliveries, lease_row_send). One `replay` sent again already is pending: left.
-- Every figure it answers counts alerts, not sends (`counted`).
WITH picked AS (
    SELECT s.row_id, s.notifier, s.status, s.done, s.skipped, t.target,
           (%(configured)s::text[] IS NULL OR t.target = ANY(%(configured)s::text[])) AS known,
           EXISTS (SELECT 1 FROM slawatch.outbox_send o
                    WHERE o.row_id = s.row_id AND o.notifier = t.target
                      AND o.notifier <> s.notifier) AS taken
      FROM slawatch.outbox_send s JOIN slawatch.outbox_row r ON r.id = s.row_id
     CROSS JOIN LATERAL (SELECT coalesce(%(to)s::text, s.notifier) AS target) t
     WHERE s.status IN ('dead', 'orphaned')
       AND (%(rule)s::text IS NULL OR r.rule = %(rule)s::text)
       AND (%(notifier)s::text IS NULL OR s.notifier = %(notifier)s::text)
), replayed AS (
    UPDATE slawatch.outbox_send s
       SET status = 'pending', notifier = p.target, attempts = 0, next_attempt_at = %(now)s,
           lease_owner = NULL, lease_expires_at = NULL,
           done = CASE WHEN p.target = p.notifier THEN s.done ELSE 0 END,
           skipped = CASE WHEN p.target = p.notifier THEN s.skipped END
      FROM picked p
     WHERE s.row_id = p.row_id AND s.notifier = p.notifier AND s.status = p.status AND p.known
       AND NOT p.taken
    RETURNING p.status AS was, s.row_id, p.target, s.done, s.skipped
), across AS MATERIALIZED (
    SELECT * FROM unnest(%(across_rules)s::text[], %(across_keys)s::text[],
                         %(across_episodes)s::integer[], %(across_fired)s::timestamptz[],
                         %(across_targets)s::text[]) AS t(rule, key, episode, fired_at, target)
), across_since AS (
    SELECT t.rule, min(t.fired_at) AS since FROM across t GROUP BY t.rule
), across_by AS MATERIALIZED (
    -- The targets of each episode by "<rule>:<key>:<episode>" (the rule has no colon, the
    -- episode is after the last one), read by binary search once per element of the
    -- rules' resolved rows fired since: a join of those elements with `across` was
    -- planned on estimates (a nested loop of every element with every replayed alert).
    SELECT jsonb_object_agg(x.id, x.targets) AS targets
      FROM (SELECT t.rule || ':' || t.key || ':' || t.episode AS id,
                   jsonb_agg(DISTINCT t.target) AS targets
              FROM across t GROUP BY 1) x
), closing AS (
    SELECT c.id AS row_id, x.target
      FROM replayed x
      JOIN slawatch.outbox_row f ON f.id = x.row_id AND f.kind = 'firing'
      JOIN slawatch.outbox_row c
        ON c.rule = f.rule AND c.fired_at >= f.fired_at AND c.kind = 'resolved'
       AND c.id > f.id AND c.keys && f.keys
     WHERE EXISTS (
            SELECT 1 FROM unnest(f.keys, f.episodes) WITH ORDINALITY AS e(key, episode, p)
              JOIN unnest(c.keys, c.episodes) AS o(key, episode)
                ON o.key = e.key AND o.episode = e.episode
             WHERE e.p > x.done AND x.skipped[e.p] IS NULL)
       AND NOT EXISTS (SELECT 1 FROM replayed y WHERE y.row_id = c.id AND y.target = x.target)
    UNION
    SELECT c.id, x.target
      FROM across_since g
      JOIN slawatch.outbox_row c
        ON c.rule = g.rule AND c.fired_at >= g.since AND c.kind = 'resolved'
     CROSS JOIN LATERAL unnest(c.keys, c.episodes) AS o(key, episode)
     CROSS JOIN LATERAL jsonb_array_elements_text(
           (SELECT b.targets FROM across_by b) -> (c.rule || ':' || o.key || ':' || o.episode))
           AS x(target)
     WHERE NOT EXISTS (SELECT 1 FROM replayed y WHERE y.row_id = c.id AND y.target = x.target)
), closing_alerts AS (
    SELECT DISTINCT r.id AS alert_id, x.target
      FROM replayed x
      JOIN slawatch.outbox_row f ON f.id = x.row_id AND f.kind = 'firing'
     CROSS JOIN LATERAL unnest(f.keys, f.episodes) WITH ORDINALITY AS e(key, episode, p)
      JOIN slawatch.alert r
        ON r.rule = f.rule AND r.key = e.key AND r.episode = e.episode AND r.n = 0
     WHERE e.p > x.done AND x.skipped[e.p] IS NULL AND NOT starts_with(x.target, 'action:')
), resent_alerts AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT alert_id, target, %(now)s FROM closing_alerts
    ON CONFLICT ON CONSTRAINT delivery_once DO UPDATE
       SET status = 'pending', attempts = 0, next_attempt_at = excluded.next_attempt_at,
           lease_owner = NULL, lease_expires_at = NULL
     WHERE slawatch.delivery.status <> 'pending'
    RETURNING 1
), resent AS (
    -- (A send `replayed` moved is left out above: one statement must not write it twice.)
    INSERT INTO slawatch.outbox_send (row_id, notifier, next_attempt_at)
    SELECT row_id, target, %(now)s FROM closing
    ON CONFLICT (row_id, notifier) DO UPDATE
       SET status = 'pending', attempts = 0, done = 0, skipped = NULL,
           next_attempt_at = excluded.next_attempt_at, lease_owner = NULL,
           lease_expires_at = NULL, last_error = NULL
     WHERE slawatch.outbox_send.status <> 'pending'
    RETURNING row_id, done, skipped
), counted AS (
    -- Counted in alerts, as the page and `slawatch status` count sends (delivery_backlog):
    -- each send's elements from `done` on not settled unsent; its row a probe of its key.
    SELECT x.what, count(*) AS n
      FROM (SELECT was::text AS what, row_id, done, skipped FROM replayed
            UNION ALL
            SELECT CASE WHEN known THEN 'taken' ELSE 'left' END, row_id, done, skipped
              FROM picked WHERE taken OR NOT known
            UNION ALL
            SELECT 'resolved', row_id, done, skipped FROM resent) x
     CROSS JOIN LATERAL (
           SELECT cardinality(r.ns) AS size FROM slawatch.outbox_row r
            WHERE r.id = x.row_id OFFSET 0) r
     CROSS JOIN LATERAL generate_series(x.done + 1, r.size) AS e(p)
     WHERE x.skipped[e.p] IS NULL
     GROUP BY x.what
)
SELECT coalesce((SELECT n FROM counted WHERE what = 'dead'), 0) AS dead,
       coalesce((SELECT n FROM counted WHERE what = 'orphaned'), 0) AS orphaned,
       coalesce((SELECT n FROM counted WHERE what = 'taken'), 0) AS taken,
       coalesce((SELECT n FROM counted WHERE what = 'left'), 0) AS left,
       coalesce((SELECT n FROM counted WHERE what = 'resolved'), 0)
           + (SELECT count(*) FROM resent_alerts) AS resolved;

-- row_leftovers --
-- Whether any dead or orphaned send goes to `notifier` (replay_leftovers).
SELECT EXISTS (SELECT 1 FROM slawatch.outbox_send
                WHERE status IN ('dead', 'orphaned') AND notifier = %(notifier)s);

-- prune_row_ranges --
-- The row id ranges prune_outbox_rows goes through, oldest first (0026_outbox_rows_ranges.sql):
-- as prune_ranges, those history_drop leaves -- closed before the cutoff (kept past
-- their turn: a send pending in them) and the open one. A range closed at or after the
-- cutoff waits for its drop. A range opened before 0026 holds no rows (row_low NULL).
SELECT h.row_low, h.row_high FROM slawatch.history_range h
 WHERE (h.closed_at IS NULL OR h.closed_at < %(cutoff)s) AND h.row_low IS NOT NULL
 ORDER BY 1;

-- prune_outbox_rows --
-- One bounded batch of the rows' history (maintain.py): rows fired before the cutoff
-- none of whose sends is pending, removed with their sends. Old rows are found per rule
-- through outbox_row_fired (the rules by a skip scan of it, as prune_history does); each
-- row's sends through the primary key. A send replayed to pending meanwhile: its DELETE
-- re-checks the status and skips it, and its row is kept. A batch reads one range,
-- row ids [lo, hi) (prune_row_ranges): every part bounds its ids to it, so each reads
-- one partition of each table (pruned when the statement starts).
-- Acks: none goes here, and none keeps a row. An ack of an element (a negative alert_id)
-- goes by its own age (prune_history's orphans), so it outlives its row while it is
-- younger than the window: the claim reads acks by (rule, key, episode), never the row
-- (docs/explanation/outbox-rows.md, "Retention"; history_drop deletes only acks of
-- today's alert ids).
WITH RECURSIVE rules AS (
    SELECT min(rule) AS rule FROM slawatch.outbox_row WHERE id >= %(lo)s AND id < %(hi)s
    UNION ALL
    SELECT (SELECT min(o.rule) FROM slawatch.outbox_row o
             WHERE o.rule > r.rule AND o.id >= %(lo)s AND o.id < %(hi)s)
      FROM rules r
     WHERE r.rule IS NOT NULL
), old AS (
    SELECT o.id
      FROM rules r CROSS JOIN LATERAL (
            SELECT w.id FROM slawatch.outbox_row w
             WHERE w.rule = r.rule AND w.fired_at < %(cutoff)s
               AND w.id >= %(lo)s AND w.id < %(hi)s
               AND (SELECT bool_or(p.status = 'pending') FROM slawatch.outbox_send p
                     WHERE p.row_id = w.id AND p.row_id >= %(lo)s AND p.row_id < %(hi)s)
                   IS NOT TRUE
             ORDER BY w.fired_at
             LIMIT %(batch)s) o
     LIMIT %(batch)s
), gone_sends AS (
    DELETE FROM slawatch.outbox_send s
     WHERE s.row_id = ANY (ARRAY(SELECT id FROM old)) AND s.status <> 'pending'
       AND s.row_id >= %(lo)s AND s.row_id < %(hi)s
    RETURNING s.row_id, s.notifier
), gone_rows AS (
    DELETE FROM slawatch.outbox_row w
     WHERE w.id = ANY (ARRAY(SELECT id FROM old)) AND w.id >= %(lo)s AND w.id < %(hi)s
       AND (SELECT bool_and((k.row_id, k.notifier) IN (SELECT row_id, notifier FROM gone_sends))
              FROM slawatch.outbox_send k
             WHERE k.row_id = w.id AND k.row_id >= %(lo)s AND k.row_id < %(hi)s) IS NOT FALSE
    RETURNING w.id
)
SELECT (SELECT count(*) FROM gone_rows), (SELECT count(*) FROM gone_sends);
