-- Issue 17 (the SLA report, docs/how-to/report.md). One row per episode (rule, key, episode):
-- when it fell due (deadline + after: the alert's due_at), when it was first notified,
-- acknowledged (and by whom) and when it ended. The claim writes the row with
-- notification #1 (engine/outbox.py), the claims and sweeps that close episodes set
-- ended_at, an ack sets acked_at (operate/lifecycle.py); the report, the on-call page
-- and /v1/report read only this table (operate/report.py). Retention prunes ended
-- episodes by ended_at; an open episode stays however old it is.
CREATE TABLE slawatch.episode (
    rule         text        NOT NULL,
    key          text        NOT NULL,
    episode      integer     NOT NULL,
    deadline     timestamptz,
    due_at       timestamptz,
    notified_at  timestamptz NOT NULL,
    acked_at     timestamptz,
    acked_by     text,
    ended_at     timestamptz,
    PRIMARY KEY (rule, key, episode)
);
-- The report's periods by due time: every figure it needs is in the index
-- (index-only scans once vacuumed).
CREATE INDEX episode_due ON slawatch.episode (rule, due_at)
    INCLUDE (deadline, notified_at, acked_at, ended_at);
-- Episodes ended in a window (the report's `open`, retention), whatever their due time.
CREATE INDEX episode_ended ON slawatch.episode (ended_at) INCLUDE (rule, due_at)
    WHERE ended_at IS NOT NULL;
-- Episodes still open: few, and counted as open at every period's end. Not led by
-- rule: the claim's updates of ended_at by (rule, key) must probe episode_pkey, and a
-- partial index of the rule's open episodes was the planner's choice instead (a scan
-- of every open episode of the rule per batch).
CREATE INDEX episode_open ON slawatch.episode (due_at) INCLUDE (rule) WHERE ended_at IS NULL;
