-- Issue 16 (actions): `webhook:` actions, which go through the outbox like a delivery.
-- The claim that owes one writes, in its transaction, a delivery of the alert to the
-- notifier `action:<rule>` and the attempt's row here with status 'pending' and that
-- delivery's id (slawatch/actions/webhook.py). The attempt is settled by the same
-- write that settles its delivery (the trigger below), whichever code path makes it
-- (sent, dead, acknowledged, silenced, orphaned, replayed): a crash between the send
-- and the settle leaves both pending, the delivery is sent again when its lease runs
-- out (at least once, as every delivery) and the record follows it.
-- The CHECKs are replaced NOT VALID: every existing row satisfies them, so no scan of
-- slawatch.action under an exclusive lock is needed (new rows are checked all the same).
ALTER TABLE slawatch.action DROP CONSTRAINT action_kind;
ALTER TABLE slawatch.action ADD CONSTRAINT action_kind
    CHECK (kind IN ('sql', 'webhook')) NOT VALID;
ALTER TABLE slawatch.action DROP CONSTRAINT action_status;
ALTER TABLE slawatch.action ADD CONSTRAINT action_status
    CHECK (status IN ('ok', 'failed', 'skipped', 'would_run', 'pending')) NOT VALID;
-- A webhook attempt's delivery (no foreign key, as delivery.alert_id has none).
ALTER TABLE slawatch.action ADD COLUMN delivery_id bigint;
-- The trigger finds an attempt by its delivery.
CREATE INDEX action_delivery ON slawatch.action (delivery_id) WHERE delivery_id IS NOT NULL;

-- A delivery to `action:<rule>` changed status: sent settles its latest attempt 'ok',
-- dead or orphaned 'failed' (with the delivery's error), acknowledged or silenced
-- 'skipped'; back to pending (`slawatch replay`, `replay --actions`) is the next attempt.
-- `at`: when the attempt was queued (the claim's or the replay's time), and once it is
-- delivered, when (the delivery's sent_at): the application's clock, never now().
CREATE FUNCTION slawatch.action_delivery_settled() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'pending' THEN
        INSERT INTO slawatch.action (rule, key, episode, n, kind, status, at, attempt, params,
                                     delivery_id)
        SELECT a.rule, a.key, a.episode, a.n, 'webhook', 'pending', NEW.next_attempt_at,
               a.attempt + 1, a.params, NEW.id
          FROM slawatch.action a
         WHERE a.delivery_id = NEW.id
         ORDER BY a.attempt DESC
         LIMIT 1;
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

-- Only deliveries to an action's target fire it: the WHEN is evaluated without calling
-- the function, so every other delivery's settle pays one string comparison.
CREATE TRIGGER action_settled
    AFTER UPDATE OF status ON slawatch.delivery
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.notifier LIKE 'action:%')
    EXECUTE FUNCTION slawatch.action_delivery_settled();
