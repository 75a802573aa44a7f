-- Issue 24. Events of a type no rule knows (yet): slawatch.event() keeps them here
-- instead of dropping them (or failing the application's transaction), and migrate
-- applies them, in the order they came, once a rule for their type is migrated
-- (engine/migrate.py). Retention prunes what no rule ever claimed, by received.
CREATE TABLE slawatch.event_held (
    n         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- the order they came in
    received  timestamptz NOT NULL,
    type      text        NOT NULL,
    key       text        NOT NULL,
    at        timestamptz NOT NULL,
    data      jsonb       NOT NULL DEFAULT '{}',
    id        text
);
CREATE INDEX event_held_type ON slawatch.event_held (type);
CREATE INDEX event_held_received ON slawatch.event_held (received);
