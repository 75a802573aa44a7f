-- When each rule was last scanned, idle scans included: one row per `slawatch run`
-- process, rewritten every few seconds while its scans run (slawatch/runtime/scans.py).
-- An idle scan writes nothing to slawatch.scan (but once a minute): `slawatch status`
-- and /v1/rules show the later of the two, so "last scan" is the last scan run, at the
-- cost of one row written per process every few seconds, not one per rule.
CREATE TABLE slawatch.scanner (
    instance  text        PRIMARY KEY,  -- host:pid:random of the process
    at        timestamptz NOT NULL,     -- when the process wrote this row
    scans     jsonb       NOT NULL      -- {"rule": "2026-11-27T10:00:00Z", ...}: its last scans
);
