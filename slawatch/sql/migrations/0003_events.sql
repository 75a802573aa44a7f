-- Issue 15 (events). Event ids already seen, per type: a repeat within a day is
-- dropped (engine/timers.py). Retention prunes the rows older than that by seen_at.
-- The timer tables and the functions that feed them come from the rules (migrate).
CREATE TABLE slawatch.event_seen (
    type  text        NOT NULL,
    id    text        NOT NULL,
    at    timestamptz NOT NULL,
    PRIMARY KEY (type, id)
);
CREATE INDEX event_seen_at ON slawatch.event_seen (at);
