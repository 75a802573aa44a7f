-- slawatch's own tables: the outbox of alerts and their deliveries.
-- Idempotent: safe to run on every `slawatch migrate`.
CREATE SCHEMA IF NOT EXISTS slawatch;

-- One row per notification of a watched row: (rule, key, episode, n) exists at
-- most once. An episode is one stretch of a row being overdue (DESIGN.md §1).
CREATE TABLE IF NOT EXISTS slawatch.alert (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule        text        NOT NULL,
    key         text        NOT NULL,
    episode     integer     NOT NULL,
    n           integer     NOT NULL,
    severity    text        NOT NULL,
    deadline    timestamptz,
    due_at      timestamptz,
    fired_at    timestamptz NOT NULL,
    row_data    jsonb       NOT NULL,
    CONSTRAINT alert_once UNIQUE (rule, key, episode, n)
);
-- Upgrade from before episodes: what was notified so far is episode 1.
ALTER TABLE slawatch.alert ADD COLUMN IF NOT EXISTS episode integer NOT NULL DEFAULT 1;
ALTER TABLE slawatch.alert ALTER COLUMN episode DROP DEFAULT;
DO $$
BEGIN
    IF (SELECT array_length(conkey, 1) FROM pg_constraint
         WHERE conrelid = 'slawatch.alert'::regclass AND conname = 'alert_once') = 3 THEN
        ALTER TABLE slawatch.alert DROP CONSTRAINT alert_once;
        ALTER TABLE slawatch.alert ADD CONSTRAINT alert_once UNIQUE (rule, key, episode, n);
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS alert_rule_fired ON slawatch.alert (rule, fired_at);

-- One row per (alert, notifier): the delivery state machine pending -> sent | dead.
-- alert_id has no foreign key on purpose: the claim writes an alert and its
-- deliveries in one statement, and a per-row FK check cost a quarter of the
-- claim's time in bench/claim.py.
CREATE TABLE IF NOT EXISTS slawatch.delivery (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert_id         bigint      NOT NULL,
    notifier         text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'sent', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    last_error       text,
    sent_at          timestamptz,
    CONSTRAINT delivery_once UNIQUE (alert_id, notifier)
);
-- Only deliveries still to do are indexed, like the watched tables.
CREATE INDEX IF NOT EXISTS delivery_due ON slawatch.delivery (notifier, next_attempt_at)
    WHERE status = 'pending';

-- track: table: per rule, up to where the last complete scan read the deadlines,
-- and when the last sweep ran (see slawatch/statetable.py).
CREATE TABLE IF NOT EXISTS slawatch.watermark (
    rule        text PRIMARY KEY,
    scanned_to  timestamptz NOT NULL,
    swept_at    timestamptz
);

-- Dead deliveries are few and wait for a person: `slawatch status`, the alerts list
-- and /v1/stats find them here instead of reading the whole delivery history.
CREATE INDEX IF NOT EXISTS delivery_dead ON slawatch.delivery (alert_id)
    WHERE status = 'dead';

-- The last scan of each rule, written after every scan of `slawatch run`
-- (slawatch/scans.py): what `slawatch status` and /v1/rules show as "last scan".
CREATE TABLE IF NOT EXISTS slawatch.scan (
    rule        text PRIMARY KEY,
    last_at     timestamptz NOT NULL,
    duration_ms bigint      NOT NULL,
    claimed     bigint      NOT NULL,
    error       text
);
