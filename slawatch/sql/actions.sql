-- Fixed queries of slawatch/actions, one block each under a "-- name --" header.

-- record_actions --
-- Every attempt of one claim's actions, in the claim's transaction. action_once makes
-- a second record of the same attempt an error: the claim rolls back, not the rule.
INSERT INTO slawatch.action (rule, key, episode, n, kind, status, rows, error, at, attempt,
                             params)
SELECT %(rule)s, r.key, r.episode, r.n, 'sql', r.status, r.rows, r.error, %(at)s,
       r.attempt, r.params
  FROM jsonb_to_recordset(%(records)s::jsonb)
       AS r(key text, episode integer, n integer, status text, rows bigint, error text,
            attempt integer, params jsonb)
