-- An sql action's attempt may be recorded 'retry': a row the application held past the
-- action's lock_timeout, or the claim batch's time for actions ran out before it (docs/how-to/actions.md). The rule's next scan runs it again as the next attempt; the index finds
-- the few waiting (most scans find none).
ALTER TABLE slawatch.action DROP CONSTRAINT action_status;
ALTER TABLE slawatch.action ADD CONSTRAINT action_status
    CHECK (status IN ('ok', 'failed', 'skipped', 'would_run', 'pending', 'retry')) NOT VALID;
CREATE INDEX action_retry ON slawatch.action (rule) WHERE status = 'retry';
