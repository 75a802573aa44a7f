-- A new episode's number where a claim met notifications or episode rows written
-- already (engine/outbox.py, unguarded_first: the claim sent again with its guards).
--
-- An inline rule keeps its tracking columns on the watched row, so a row deleted and
-- its key inserted again starts over at episode 0, and its next episode would be one
-- the key had before. That episode's history row and notifications are still there
-- (within retention), so the guards, which pass over a row written already, would pass
-- over the new episode's: a key's new overdue stretch never paged. An event rule's
-- timer pruned by retention and started again is the same. So the guarded claim
-- numbers a new episode past every episode the key has in the history and in
-- slawatch.alert, unless one of those has the very deadline the row has now: that is
-- the same episode seen again (tracking state restored from a backup taken before its
-- notification #1), which the guards pass over as before, and nothing is paged twice.
-- Each look is a probe of episode_pkey or of a range's alert_once, led by (rule, key);
-- it runs only in the guarded claim, never in the claim as first sent.
CREATE OR REPLACE FUNCTION slawatch.next_episode(p_rule text, p_key text, p_ep integer,
                                      p_deadline timestamptz)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT min(s.episode) FROM (
              SELECT h.episode FROM slawatch.episode h
               WHERE h.rule = p_rule AND h.key = p_key AND h.episode > p_ep
                 AND h.deadline IS NOT DISTINCT FROM p_deadline
              UNION ALL
              SELECT a.episode FROM slawatch.alert a
               WHERE a.rule = p_rule AND a.key = p_key AND a.episode > p_ep AND a.n = 1
                 AND a.deadline IS NOT DISTINCT FROM p_deadline) s),
        greatest(p_ep,
                 (SELECT max(h.episode) FROM slawatch.episode h
                   WHERE h.rule = p_rule AND h.key = p_key),
                 (SELECT max(a.episode) FROM slawatch.alert a
                   WHERE a.rule = p_rule AND a.key = p_key)) + 1)
$$;
