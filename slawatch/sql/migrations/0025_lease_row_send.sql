-- The outbox in rows (0020_outbox_rows.sql; docs/explanation/outbox-rows.md): the lease of
-- a row send as a function, planned once per server session. The dispatcher ran the
-- lease's statement prepared on its generic plan without JIT, a set_config of both sent
-- with each lease in one pipelined request; behind a transaction pooler
-- (SLAWATCH_POOLER=transaction) nothing is prepared and the statement was planned at every
-- lease (0.85 ms of its 1.6 ms of server CPU). PL/pgSQL keeps the plan of its statement
-- for the server session, pooled or not, and the function's own settings
-- (plan_cache_mode, jit) hold for its call alone: one short statement per lease, no
-- set_config beside it (docs/performance.md, "The outbox in rows, built").
--
-- The statement is the one queries.sql had as lease_row_send, its parameters now the
-- function's arguments (see there, lease_row_send, for what each part does): one due
-- send of `notifier_name` leased to `new_owner` until `at` + `lease` (FOR UPDATE SKIP
-- LOCKED; a HOT update), `sent_row` leased to `sent_owner` settled 'sent' with
-- `sent_done` and `sent_skipped` in the same statement (fenced by the owner; SKIP LOCKED:
-- `settled` says whether it was), a resolved row's send held while a firing row's or a
-- firing delivery of its episodes is pending to the notifier, and one line back: the
-- leased row's arrays from element `done` + 1 on, the times as text in the claim's form,
-- `row_data` as one json array, `skips` per element (acknowledged, silenced, or NULL;
-- all NULL without a probe per element where the rule has no ack nor active silence);
-- a line of NULLs with `settled` when nothing was leased. Its commit is asynchronous
-- (set_config(..., true) in `due`: it lasts to the end of the caller's transaction).

CREATE OR REPLACE FUNCTION slawatch.lease_row_send(
        notifier_name text, at timestamptz, new_owner uuid, lease interval,
        sent_row bigint, sent_owner uuid, sent_done integer, sent_skipped text[])
    RETURNS TABLE (row_id bigint, attempts integer, done integer, skipped text[],
                   size integer, rule text, kind text, fired_at text, keys text[],
                   episodes integer[], ns integer[], severities text[], deadlines text[],
                   due_ats text[], row_data json, skips text[], settled boolean)
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
    SET jit = off AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH sent AS (
        UPDATE slawatch.outbox_send s
           SET status = 'sent', sent_at = at, done = sent_done, skipped = sent_skipped,
               lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
          FROM (SELECT o.row_id, o.notifier FROM slawatch.outbox_send o
                 WHERE o.row_id = sent_row AND o.notifier = notifier_name
                   AND o.lease_owner = sent_owner
                   FOR UPDATE SKIP LOCKED) l
         WHERE s.row_id = l.row_id AND s.notifier = l.notifier
        RETURNING s.row_id
    ), due AS (
        SELECT s.row_id, s.notifier
          FROM slawatch.outbox_send s
          JOIN slawatch.outbox_row r ON r.id = s.row_id
         WHERE s.notifier = notifier_name AND s.status = 'pending' AND s.next_attempt_at <= at
           AND (s.lease_expires_at IS NULL OR s.lease_expires_at <= at)
           AND coalesce(s.lease_owner <> sent_owner, true)
           AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
           AND (r.kind <> 'resolved' OR (
                NOT EXISTS (
                    SELECT 1 FROM (
                           SELECT p.row_id FROM slawatch.outbox_send p
                            WHERE p.notifier = s.notifier AND p.status = 'pending'
                              AND p.row_id < r.id
                              AND coalesce(p.lease_owner <> sent_owner, true)
                           OFFSET 0) p
                     CROSS JOIN LATERAL (
                           SELECT 1 FROM slawatch.outbox_row f
                            WHERE f.id = p.row_id AND f.rule = r.rule AND f.kind = 'firing'
                              AND f.keys && r.keys OFFSET 0) f)
                AND NOT EXISTS (
                    SELECT 1 FROM unnest(r.keys, r.episodes) AS e(key, episode)
                     CROSS JOIN LATERAL (
                           SELECT a.id FROM slawatch.alert a
                            WHERE a.rule = r.rule AND a.key = e.key AND a.episode = e.episode
                              AND a.n > 0 OFFSET 0) a
                     CROSS JOIN LATERAL (
                           SELECT d.status FROM slawatch.delivery d
                            WHERE d.alert_id = a.id AND d.notifier = s.notifier OFFSET 0) d
                     WHERE d.status = 'pending')))
         ORDER BY s.next_attempt_at
         LIMIT 1
           FOR UPDATE OF s SKIP LOCKED
    ), leased AS (
        UPDATE slawatch.outbox_send s
           SET lease_owner = new_owner, lease_expires_at = at + lease,
               attempts = s.attempts + 1
          FROM due
         WHERE s.row_id = due.row_id AND s.notifier = due.notifier
        RETURNING s.row_id, s.attempts, s.done, s.skipped
    )
    SELECT l.row_id, l.attempts, l.done, l.skipped, cardinality(r.keys), r.rule, r.kind,
           replace(to_char(r.fired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
                   '.000000', '') || 'Z',
           r.keys[l.done + 1:], r.episodes[l.done + 1:], r.ns[l.done + 1:],
           r.severities[l.done + 1:],
           ARRAY(SELECT replace(to_char(e.deadline AT TIME ZONE 'UTC',
                                        'YYYY-MM-DD"T"HH24:MI:SS.US'), '.000000', '') || 'Z'
                   FROM unnest(r.deadlines[l.done + 1:]) AS e(deadline)),
           ARRAY(SELECT replace(to_char(coalesce(e.due_at, e.deadline + r.after)
                                        AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
                                '.000000', '') || 'Z'
                   FROM unnest(r.deadlines[l.done + 1:], r.due_ats[l.done + 1:])
                        AS e(deadline, due_at)),
           array_to_json(CASE WHEN l.done = 0 THEN r.row_data ELSE r.row_data[l.done + 1:] END),
           CASE WHEN (r.kind = 'firing' AND EXISTS (
                          SELECT 1 FROM slawatch.ack k WHERE k.rule = r.rule))
                     OR EXISTS (
                          SELECT 1 FROM slawatch.silence s
                           WHERE s.rule = r.rule AND s.ends_at > at AND s.starts_at <= at)
                THEN ARRAY(
                     SELECT CASE WHEN r.kind = 'firing' AND EXISTS (
                                      SELECT 1 FROM slawatch.ack k
                                       WHERE k.rule = r.rule AND k.key = e.key
                                         AND k.episode = e.episode)
                                 THEN 'acknowledged'
                                 WHEN EXISTS (
                                      SELECT 1 FROM slawatch.silence s
                                       WHERE s.rule = r.rule AND s.ends_at > at
                                         AND s.starts_at <= at
                                         AND (s.key IS NULL OR s.key = e.key)
                                         AND e.row_data @> s.matchers)
                                 THEN 'silenced' END
                       FROM unnest(r.keys[l.done + 1:], r.episodes[l.done + 1:],
                                   r.row_data[l.done + 1:]) AS e(key, episode, row_data))
                END,
           (SELECT count(*) FROM sent) > 0
      FROM leased l
      JOIN slawatch.outbox_row r ON r.id = l.row_id
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, (SELECT count(*) FROM sent) > 0
     WHERE NOT EXISTS (SELECT 1 FROM leased);
END
$$;
