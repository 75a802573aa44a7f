-- Issue 27: the outbox in rows of alerts (docs/explanation/outbox-rows.md). A preview
-- beside today's outbox (slawatch.alert and slawatch.delivery), written only when
-- SLAWATCH_OUTBOX=rows; the delivery workers drain both.
--
-- outbox_row: up to 100 alerts of one rule, of one kind, fired by one claim, for one
-- set of notifiers (escalation tiers that page others by n make rows of their own).
-- Element i of the arrays is one alert: (keys[i], episodes[i], ns[i], severities[i],
-- deadlines[i], row_data[i]); its due_at is deadlines[i] + after; its idempotency id is
-- today's (rule, key, episode, n; outbox.alert_id). Written once by the claim, never
-- updated: what changes is in outbox_send. One heap row and one index entry per 100
-- alerts, where today's outbox writes three rows and seven entries per alert.
CREATE TABLE slawatch.outbox_row (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('firing', 'resolved')),
    fired_at timestamptz NOT NULL,
    after interval NOT NULL,
    notifiers text[] NOT NULL,
    keys text[] NOT NULL,
    episodes integer[] NOT NULL,
    ns integer[] NOT NULL,
    severities text[] NOT NULL,
    deadlines timestamptz[] NOT NULL,  -- an element is NULL where the deadline is not finite
    row_data jsonb[] NOT NULL,
    CHECK (cardinality(keys) BETWEEN 1 AND 100
           AND cardinality(episodes) = cardinality(keys) AND cardinality(ns) = cardinality(keys)
           AND cardinality(severities) = cardinality(keys)
           AND cardinality(deadlines) = cardinality(keys)
           AND cardinality(row_data) = cardinality(keys))
);
-- The page, the API and retention find a rule's rows by when they fired.
CREATE INDEX outbox_row_fired ON slawatch.outbox_row (rule, fired_at);

-- One row's delivery to one of its notifiers: leased, sent and settled as one batch.
-- `done`: the elements settled so far, in order (a notifier whose batch is smaller than
-- the row sends it in several requests; a retry starts at the first not settled).
-- `skipped`: per element, NULL, or why it was settled unsent ('acknowledged',
-- 'silenced'). The lease writes only lease_owner, lease_expires_at and attempts, which no
-- index covers: a HOT update (fillfactor leaves room on the page).
CREATE TABLE slawatch.outbox_send (
    row_id bigint NOT NULL,
    notifier text NOT NULL,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'sent', 'dead', 'orphaned')),
    attempts integer NOT NULL DEFAULT 0,
    done integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    lease_owner uuid,
    lease_expires_at timestamptz,
    last_error text,
    sent_at timestamptz,
    skipped text[],
    PRIMARY KEY (row_id, notifier)
) WITH (fillfactor = 70);
CREATE INDEX outbox_send_due ON slawatch.outbox_send (notifier, next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX outbox_send_dead ON slawatch.outbox_send (notifier)
    WHERE status IN ('dead', 'orphaned');

-- The rows' data compresses with lz4 where the server has it (PostgreSQL's packages
-- do): an array of 100 jsonb values compresses in a fifth of pglz's time
-- (docs/performance.md, "The lean outbox: shapes measured").
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings
                WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE slawatch.outbox_row ALTER COLUMN row_data SET COMPRESSION lz4;
    END IF;
END
$$;
