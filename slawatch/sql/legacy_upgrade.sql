-- FROZEN: do not edit. Schema changes go in migrations/NNNN_name.sql
-- (docs/contributing.md); tests/unit/test_schema.py pins this file's hash.
--
-- This is the last release's schema.sql from before versioned migrations, kept as it
-- was. Databases made before versioning may be at any of the older shapes it
-- upgrades (before episodes, silences, storms, ...), and this script was their one
-- upgrade path: it inspects the catalog and brings any of them to the shape of
-- migrations/0001_initial.sql. slawatch runs it once, on a database with slawatch's
-- tables but no recorded version, and records 0001 as applied in the same transaction.
-- Below: the file as it shipped.
--
-- slawatch's own tables: the outbox of alerts and their deliveries.
-- Idempotent: safe to run on every `slawatch migrate`.
CREATE SCHEMA IF NOT EXISTS slawatch;

-- One row per notification of a watched row: (rule, key, episode, n) exists at
-- most once. An episode is one stretch of a row being overdue (docs/explanation/episodes.md).
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
-- 'firing': notification n (1, 2, ...) of an episode; 'resolved': the one notice that a
-- notified episode ended (rule `resolve: true`), stored as n = 0 so alert_once keeps
-- it to one per episode. Adding a column with a constant default rewrites nothing.
-- 'summary': one storm summary (slawatch/storm.py) for one notifier, standing in for
-- the deliveries it replaced (delivery.summary_id); episode and n are 0, and the key
-- 'storm:<notifier>:<first alert id>' keeps alert_once unique.
ALTER TABLE slawatch.alert ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'firing'
    CONSTRAINT alert_kind CHECK (kind IN ('firing', 'resolved', 'summary'));
-- Upgrade from before storms: the CHECK allowed two kinds. NOT VALID, as below.
DO $$
BEGIN
    IF (SELECT pg_get_constraintdef(oid) FROM pg_constraint
         WHERE conrelid = 'slawatch.alert'::regclass AND conname = 'alert_kind')
       NOT LIKE '%summary%' THEN
        ALTER TABLE slawatch.alert DROP CONSTRAINT alert_kind;
        ALTER TABLE slawatch.alert ADD CONSTRAINT alert_kind
            CHECK (kind IN ('firing', 'resolved', 'summary')) NOT VALID;
    END IF;
END $$;

-- One row per (alert, notifier): the delivery state machine pending -> sent | dead |
-- silenced (a silence matched the alert when it was due to be sent: never sent) |
-- summarized (a storm summary was sent in its place: summary_id names that alert).
-- alert_id has no foreign key on purpose: the claim writes an alert and its
-- deliveries in one statement, and a per-row FK check cost a quarter of the
-- claim's time in bench/claim.py.
CREATE TABLE IF NOT EXISTS slawatch.delivery (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert_id         bigint      NOT NULL,
    notifier         text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                                 CONSTRAINT delivery_status
                                 CHECK (status IN ('pending', 'sent', 'dead', 'silenced',
                                                   'summarized')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    last_error       text,
    sent_at          timestamptz,
    CONSTRAINT delivery_once UNIQUE (alert_id, notifier)
);
-- Upgrade from before silences (an unnamed CHECK of three states) or from before
-- storms (delivery_status without 'summarized'): the current CHECK replaces either,
-- added NOT VALID: every existing row satisfies it, so no scan of the outbox under an
-- exclusive lock is needed (new rows are checked all the same).
DO $$
BEGIN
    IF coalesce((SELECT pg_get_constraintdef(oid) FROM pg_constraint
                  WHERE conrelid = 'slawatch.delivery'::regclass
                    AND conname = 'delivery_status'), '') NOT LIKE '%summarized%' THEN
        ALTER TABLE slawatch.delivery DROP CONSTRAINT IF EXISTS delivery_status_check;
        ALTER TABLE slawatch.delivery DROP CONSTRAINT IF EXISTS delivery_status;
        ALTER TABLE slawatch.delivery ADD CONSTRAINT delivery_status
            CHECK (status IN ('pending', 'sent', 'dead', 'silenced', 'summarized')) NOT VALID;
    END IF;
END $$;
-- The storm summary (an alert of kind 'summary') a 'summarized' delivery was folded into.
ALTER TABLE slawatch.delivery ADD COLUMN IF NOT EXISTS summary_id bigint;
-- A summary's deliveries in alert order: its first ones are listed in the message.
CREATE INDEX IF NOT EXISTS delivery_summary ON slawatch.delivery (summary_id, alert_id)
    WHERE summary_id IS NOT NULL;
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

-- Acknowledgements: an acked episode is not notified again (the claim reads this when
-- a re-notification of the episode comes due, and clears it instead); a new episode
-- of the same row pages again. One per episode: the first ack is kept.
CREATE TABLE IF NOT EXISTS slawatch.ack (
    rule      text        NOT NULL,
    key       text        NOT NULL,
    episode   integer     NOT NULL,
    alert_id  bigint      NOT NULL,  -- the alert that was acknowledged
    acked_at  timestamptz NOT NULL,
    acked_by  text        NOT NULL,
    comment   text        NOT NULL DEFAULT '',
    PRIMARY KEY (rule, key, episode)
);

-- Silences: deliveries of matching alerts are settled 'silenced' instead of sent while
-- starts_at <= now < ends_at (the application's clock). `key` NULL: every key;
-- `matchers`: a JSON object of alert row fields that must be equal (jsonb containment,
-- '{}' matches every alert). Deleting a silence ends it (ends_at = the time of deletion).
CREATE TABLE IF NOT EXISTS slawatch.silence (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule        text        NOT NULL,
    key         text,
    matchers    jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(matchers) = 'object'),
    starts_at   timestamptz NOT NULL,
    ends_at     timestamptz NOT NULL,
    created_at  timestamptz NOT NULL,
    author      text        NOT NULL,
    comment     text        NOT NULL DEFAULT ''
);
-- The delivery claim probes this per due delivery: the rule's silences by end time.
CREATE INDEX IF NOT EXISTS silence_rule_ends ON slawatch.silence (rule, ends_at);

-- Dead deliveries are few and wait for a person: `slawatch status`, the alerts list,
-- /v1/stats and the metrics find them here instead of reading the whole delivery history.
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

-- First deployment (slawatch migrate --baseline, slawatch/baseline.py): per rule, the
-- rows baselines marked as seen (all runs, each batch adding its count in its own
-- transaction) and when the last one ran.
CREATE TABLE IF NOT EXISTS slawatch.baseline (
    rule          text PRIMARY KEY,
    rows          bigint      NOT NULL,
    baselined_at  timestamptz NOT NULL
);
