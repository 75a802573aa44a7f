-- The demo's sample shop (also the schema docker-compose.yml starts PostgreSQL with).
-- Resets: drops the shop's tables and slawatch's schema first.
DROP SCHEMA IF EXISTS slawatch CASCADE;
DROP TABLE IF EXISTS public.orders, public.refunds, public.shipments, public.jobs, public.tasks
    CASCADE;
CREATE TABLE public.orders (
    id          bigint PRIMARY KEY,
    user_id     bigint NOT NULL,
    total_cents integer NOT NULL,
    status      text NOT NULL,          -- paid | shipped
    paid_at     timestamptz
);
CREATE TABLE public.refunds (
    id           bigint PRIMARY KEY,
    order_id     bigint NOT NULL,
    amount_cents integer NOT NULL,
    status       text NOT NULL,         -- requested | processed
    requested_at timestamptz NOT NULL
);
CREATE TABLE public.shipments (
    id           bigint PRIMARY KEY,
    order_id     bigint NOT NULL,
    carrier      text NOT NULL,
    status       text NOT NULL,         -- in_transit | delivered
    delivered_at timestamptz,
    confirmed_at timestamptz
);
CREATE TABLE public.jobs (
    id           bigint PRIMARY KEY,
    kind         text NOT NULL,
    worker       text NOT NULL,
    status       text NOT NULL,         -- running | done | queued (restarted by job_hung)
    heartbeat_at timestamp,             -- UTC wall time, no time zone
    error_text   text,                  -- why it last stopped ('hanged': job_hung restarted it)
    restarts     integer NOT NULL DEFAULT 0
);
-- A scheduler's task table (Asyncflow's t_schedule_task): a task runs at order_time; one
-- still running 10 minutes after it started has timed out, and task_timeout reschedules it.
CREATE TABLE public.tasks (
    id             bigint PRIMARY KEY,
    kind           text NOT NULL,
    status         text NOT NULL,       -- pending | running | done
    order_time     timestamptz NOT NULL, -- when it is to run (next)
    modify_time    timestamptz NOT NULL, -- its last change: for a running task, its start
    retry_interval interval NOT NULL DEFAULT '5 minutes',
    retries        integer NOT NULL DEFAULT 0
);
