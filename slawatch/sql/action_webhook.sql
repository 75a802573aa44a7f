-- Fixed queries of slawatch/actions/webhook.py, one block each under a "-- name --" header.

-- record_webhook_actions --
-- One claim's webhook actions, in the claim's transaction: a delivery of each pending
-- one's alert to the action's target (the notifier `action:<rule>`: the delivery
-- workers send it, retry it, let it die), and every attempt's row, a pending one with
-- its delivery's id (the trigger of 0005_action_webhook.sql settles it with it). The
-- alert was inserted by this claim: found by alert_once.
WITH r AS (
    SELECT * FROM jsonb_to_recordset(%(records)s::jsonb)
           AS r(key text, episode integer, n integer, status text, error text, params jsonb)
), owed AS (
    SELECT r.key, r.episode, a.id AS alert_id
      FROM r JOIN slawatch.alert a
             ON a.rule = %(rule)s AND a.key = r.key AND a.episode = r.episode AND a.n = r.n
     WHERE r.status = 'pending'
), deliveries AS (
    INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)
    SELECT alert_id, %(target)s, %(now)s::timestamptz FROM owed
    RETURNING id, alert_id
)
INSERT INTO slawatch.action (rule, key, episode, n, kind, status, error, at, attempt, params,
                             delivery_id)
SELECT %(rule)s, r.key, r.episode, r.n, 'webhook', r.status, r.error, %(now)s, 1, r.params,
       d.id
  FROM r LEFT JOIN owed o ON o.key = r.key AND o.episode = r.episode
         LEFT JOIN deliveries d ON d.alert_id = o.alert_id

-- replay_webhook_actions --
-- The dead (or orphaned) deliveries of the rules' failed webhook actions back to pending,
-- as `slawatch replay` does; the trigger records each as the action's next attempt.
-- Each delivery is found by its alert (the action's (rule, key, episode, n): a probe of
-- alert_once in each range, LATERAL with OFFSET 0 so that it stays a probe per action,
-- never a hash of the whole history: 2,000 failed actions among 100,000 alerts were
-- hashed, 160 ms) and then by (alert_id, id) through delivery_once: delivery.id alone
-- has no index (0018_lean_outbox.sql).
UPDATE slawatch.delivery d
   SET status = 'pending', attempts = 0, next_attempt_at = %(now)s, lease_owner = NULL,
       lease_expires_at = NULL
 WHERE (d.alert_id, d.id) IN (
       SELECT x.id, a.delivery_id FROM slawatch.action a
        CROSS JOIN LATERAL (
              SELECT y.id FROM slawatch.alert y
               WHERE y.rule = a.rule AND y.key = a.key AND y.episode = a.episode
                 AND y.n = a.n OFFSET 0) x
        WHERE a.status = 'failed' AND a.rule = ANY (%(rules)s) AND a.kind = 'webhook')
   AND d.status IN ('dead', 'orphaned')

-- failed_webhook_actions --
-- How many replay_webhook_actions would put back (SLAWATCH_ACTIONS=off or dry-run).
SELECT count(*)
  FROM slawatch.delivery d
 WHERE (d.alert_id, d.id) IN (
       SELECT x.id, a.delivery_id FROM slawatch.action a
        CROSS JOIN LATERAL (
              SELECT y.id FROM slawatch.alert y
               WHERE y.rule = a.rule AND y.key = a.key AND y.episode = a.episode
                 AND y.n = a.n OFFSET 0) x
        WHERE a.status = 'failed' AND a.rule = ANY (%(rules)s) AND a.kind = 'webhook')
   AND d.status IN ('dead', 'orphaned')

-- wake_deliveries --
SELECT pg_notify('slawatch_delivery', '')
