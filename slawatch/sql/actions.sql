-- Fixed queries of slawatch/actions, one block each under a "-- name --" header.

-- record_actions --
-- Every attempt of one claim's actions, in the claim's transaction. The claim leaves out
-- an episode that has an attempt already (engine/acting.py: its rule's `on` or action
-- changed after it acted), so a second record of the same attempt is a race the claim
-- lost: action_once makes it an error, that claim rolls back and the next one sees it.
INSERT INTO slawatch.action (rule, key, episode, n, kind, status, rows, error, at, attempt,
                             params)
SELECT %(rule)s, r.key, r.episode, r.n, 'sql', r.status, r.rows, r.error, %(at)s,
       r.attempt, r.params
  FROM jsonb_to_recordset(%(records)s::jsonb)
       AS r(key text, episode integer, n integer, status text, rows bigint, error text,
            attempt integer, params jsonb)

-- record_set --
-- The records of a batch's actions run as one statement (run_set): a CTE of that
-- statement, after slawatch_p_c (its counts by ord), so the attempts are written in the
-- same round trip, under the same savepoint: one `ok` per alert with the rows its
-- action touched. `params`: one JSON array, an element per alert (a jsonb[] costs a
-- JSON text per element, escaped again as an array element). When the counts fail their checks the savepoint's rollback takes
-- these rows with it, and the batch's records are written as the fallback decides.
slawatch_p_rec AS (
    INSERT INTO slawatch.action (rule, key, episode, n, kind, status, rows, error, at,
                                 attempt, params)
    SELECT %(rule)s, r.key, r.episode, r.n, 'sql', 'ok', coalesce(c.count, 0), NULL,
           %(at)s, 1, r.params
      FROM ROWS FROM (unnest(%(ord)s::int[], %(keys)s::text[], %(episodes)s::int[],
                             %(ns)s::int[]),
                      jsonb_array_elements(%(params)s::jsonb)) AS r(ord, key, episode, n, params)
      LEFT JOIN slawatch_p_c c ON c.ord = r.ord
     ORDER BY r.ord
)

-- list_actions --
-- The latest attempts, newest first, optionally of one rule and/or one status
-- (action_at, read backwards).
SELECT id, rule, key, episode, n, kind, status, rows, error, at, attempt, params
  FROM slawatch.action
 WHERE (%(rule)s::text IS NULL OR rule = %(rule)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
 ORDER BY at DESC, id DESC
 LIMIT %(limit)s

-- failed_actions --
-- Failed attempts not retried since (no later attempt of the episode), locked so that
-- two replays take disjoint ones (action_failed, then action_once). Only those recorded
-- before the replay began (id <= upto): an attempt that fails again is not taken again.
SELECT a.id, a.rule, a.key, a.episode, a.n, a.attempt, a.params
  FROM slawatch.action a
 WHERE a.status = 'failed' AND a.rule = ANY (%(rules)s) AND a.id <= %(upto)s
   -- A webhook action's failed attempt is replayed as its dead delivery, never as SQL
   -- (its rule may have an sql action now, and its params are not that statement's).
   AND a.kind = 'sql'
   AND NOT EXISTS (SELECT 1 FROM slawatch.action b
                    WHERE b.rule = a.rule AND b.key = a.key AND b.episode = a.episode
                      AND b.attempt > a.attempt)
 ORDER BY a.id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED

-- last_action --
-- The newest attempt's id: where a replay stops.
SELECT coalesce(max(id), 0) FROM slawatch.action

-- prune_actions --
-- Attempts older than the retention window, a batch per statement (action_at).
DELETE FROM slawatch.action WHERE id = ANY (ARRAY(
    SELECT id FROM slawatch.action WHERE at < %(cutoff)s ORDER BY at LIMIT %(batch)s))

-- actions_of --
-- The attempts of the actions the alerts given as parallel arrays triggered (action_once
-- by rule, key and episode), first attempt first.
SELECT a.id, a.rule, a.key, a.episode, a.n, a.kind, a.status, a.rows, a.error, a.at,
       a.attempt, a.params
  FROM unnest(%(rules)s::text[], %(keys)s::text[], %(episodes)s::int[], %(ns)s::int[])
       AS w(rule, key, episode, n)
  JOIN slawatch.action a ON a.rule = w.rule AND a.key = w.key AND a.episode = w.episode
                        AND a.n = w.n
 ORDER BY a.rule, a.key, a.episode, a.attempt

-- enter_action --
-- Before a batch's actions run, in the claim's transaction (not under a savepoint, so
-- no rollback of one action undoes it): each statement's timeouts, and the role the
-- actions run as (NULL: the role slawatch connects as). All SET LOCAL, undone by the
-- commit; the settings before are returned for leave_action. The sub-SELECT reads
-- them before the set_config calls run (OFFSET 0 keeps it from being merged).
SELECT s.role, s.statement_timeout, s.lock_timeout,
       set_config('statement_timeout', %(timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true),
       CASE WHEN %(role)s::text IS NOT NULL THEN set_config('role', %(role)s, true) END
  FROM (SELECT current_setting('role') AS role,
               current_setting('statement_timeout') AS statement_timeout,
               current_setting('lock_timeout') AS lock_timeout
        OFFSET 0) s

-- action_timeout --
-- A statement timeout for what is left of the batch's budget (shorter than the action's).
SELECT set_config('statement_timeout', %(timeout)s, true)

-- leave_action --
-- After the batch's actions: slawatch's role and timeouts again (what enter_action read).
SELECT set_config('role', %(role)s, true),
       set_config('statement_timeout', %(timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true)

-- held_actions --
-- A rule's attempts recorded 'retry' (a row the application held, or the batch's time
-- ran out) and not retried since, locked so that two instances take disjoint ones;
-- run again at the rule's next scan (action_retry).
SELECT a.key, a.episode, a.n, a.attempt, a.params
  FROM slawatch.action a
 WHERE a.status = 'retry' AND a.rule = %(rule)s AND a.kind = 'sql'
   AND NOT EXISTS (SELECT 1 FROM slawatch.action b
                    WHERE b.rule = a.rule AND b.key = a.key AND b.episode = a.episode
                      AND b.attempt > a.attempt)
 ORDER BY a.id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
