-- Issue 13 (trust, round 2).
-- The indexes come first: CREATE INDEX reads its table under a SHARE lock (the
-- claims' inserts wait, reads go on); the CHECK's swap after them takes ACCESS
-- EXCLUSIVE on slawatch.delivery until the commit, so nothing is scanned under it.
-- (schema.apply runs each migration with a lock_timeout: it fails rather than queue
-- every running instance's statements behind it; migrate again.)

-- Orphaned deliveries wait for a person, like dead ones: `replay --notifier OLD --to
-- NEW` and `status` find them here.
CREATE INDEX delivery_orphaned ON slawatch.delivery (notifier, alert_id)
    WHERE status = 'orphaned';

-- Retention (runtime/maintain.py) finds acks older than its window by this.
CREATE INDEX ack_acked_at ON slawatch.ack (acked_at);

-- The on-call page's logins (operate/session.py): one row per session, named by an
-- HMAC, keyed with SLAWATCH_API_TOKEN, of the random id in the browser's cookie (the id
-- itself is never stored; a new token ends every session). Every slawatch instance on
-- the database accepts every session; logging out deletes the row; a login prunes a
-- bounded number of expired ones through session_expires.
CREATE TABLE slawatch.session (
    id_hash     bytea       PRIMARY KEY,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX session_expires ON slawatch.session (expires_at);


-- Deliveries gain two ways out of 'pending' besides sent, dead, silenced and summarized:
-- 'acknowledged' (its episode was acknowledged before it was sent: never sent) and
-- 'orphaned' (its notifier was removed from the configuration: `replay --to` sends it
-- on). The CHECK is replaced NOT VALID: every existing row satisfies it, so no scan of
-- the outbox under an exclusive lock is needed (new rows are checked all the same).
ALTER TABLE slawatch.delivery DROP CONSTRAINT delivery_status;
ALTER TABLE slawatch.delivery ADD CONSTRAINT delivery_status
    CHECK (status IN ('pending', 'sent', 'dead', 'silenced', 'summarized',
                      'acknowledged', 'orphaned')) NOT VALID;
