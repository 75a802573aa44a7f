-- Issue 16 (actions, docs/explanation/actions.md). One row per attempt of a rule's action: the claim
-- writes attempt 1 in its own transaction (slawatch/actions/run.py), so an action row
-- exists exactly when its alert does; `slawatch replay --actions` adds attempt 2, 3, ...
-- for a failed one. status: ok (ran, `rows` touched), failed (rolled back: `error` is
-- the database's message, or max_rows exceeded), skipped (the episode was acknowledged
-- or silenced), would_run (SLAWATCH_ACTIONS=off or dry-run). `params`: the values its
-- placeholders were bound to, so a replay runs the same statement for the same row.
CREATE TABLE slawatch.action (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule      text        NOT NULL,
    key       text        NOT NULL,
    episode   integer     NOT NULL,
    n         integer     NOT NULL,
    kind      text        NOT NULL DEFAULT 'sql' CONSTRAINT action_kind CHECK (kind IN ('sql')),
    status    text        NOT NULL
                          CONSTRAINT action_status
                          CHECK (status IN ('ok', 'failed', 'skipped', 'would_run')),
    rows      bigint,
    error     text,
    at        timestamptz NOT NULL,
    attempt   integer     NOT NULL DEFAULT 1,
    params    jsonb       NOT NULL DEFAULT '{}',
    -- Once per (rule, key, episode) and attempt, whichever instance claims.
    CONSTRAINT action_once UNIQUE (rule, key, episode, attempt)
);
-- Retention (runtime/maintain.py) prunes by time; lists read the newest first.
CREATE INDEX action_at ON slawatch.action (at);
-- Failed attempts wait for a person (`replay --actions`), like dead deliveries.
CREATE INDEX action_failed ON slawatch.action (rule) WHERE status = 'failed';
