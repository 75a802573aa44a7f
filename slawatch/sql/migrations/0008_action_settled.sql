-- 0005's trigger, numbering a replayed webhook action's attempt safely. It numbered
-- it after the delivery's own latest attempt; action_once is per episode (rule, key,
-- episode, attempt), so an attempt of the episode that is not this delivery's and
-- already has that number (one an older release's `replay --actions` wrote, running a
-- webhook's failed attempt as SQL; an action whose `on` changed mid-episode) made the
-- INSERT a unique violation: the statement that put the delivery back to pending
-- (`slawatch replay`, `replay --actions`, POST /v1/replay) aborted whole, every time.
-- Now the attempt is numbered after the episode's latest (action_once's index, one
-- probe), and ON CONFLICT DO NOTHING keeps a concurrent writer of the same number (a
-- second transaction settling another delivery of the episode at the same moment) from
-- aborting either: the delivery is still sent; that one attempt is not recorded.
-- The settling branch (sent, dead, orphaned, acknowledged, silenced) is 0005's.
CREATE OR REPLACE FUNCTION slawatch.action_delivery_settled() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'pending' THEN
        INSERT INTO slawatch.action (rule, key, episode, n, kind, status, at, attempt, params,
                                     delivery_id)
        SELECT a.rule, a.key, a.episode, a.n, 'webhook', 'pending', NEW.next_attempt_at,
               (SELECT max(b.attempt) FROM slawatch.action b
                 WHERE b.rule = a.rule AND b.key = a.key AND b.episode = a.episode) + 1,
               a.params, NEW.id
          FROM slawatch.action a
         WHERE a.delivery_id = NEW.id
         ORDER BY a.attempt DESC
         LIMIT 1
        ON CONFLICT ON CONSTRAINT action_once DO NOTHING;
    ELSE
        UPDATE slawatch.action a
           SET status = CASE WHEN NEW.status = 'sent' THEN 'ok'
                             WHEN NEW.status IN ('dead', 'orphaned') THEN 'failed'
                             ELSE 'skipped' END,
               error = CASE WHEN NEW.status = 'sent' THEN NULL
                            WHEN NEW.status = 'dead' THEN NEW.last_error
                            WHEN NEW.status = 'orphaned'
                                THEN 'orphaned: the rule no longer has this webhook action'
                            ELSE NEW.status END,
               at = CASE WHEN NEW.status = 'sent' THEN coalesce(NEW.sent_at, a.at) ELSE a.at END
         WHERE a.delivery_id = NEW.id AND a.status = 'pending';
    END IF;
    RETURN NULL;
END
$$;
