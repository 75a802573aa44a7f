-- Issue 24: one definition of a rule across the fleet at a time (docs/how-to/rolling-deploys.md). `slawatch migrate` records, per rule, a hash of
-- what decides its episodes (table or event types, track, key, deadline, after,
-- timezone, open_when, calendar, action): its generation. Every statement of a
-- running instance that opens, closes or acts on the rule's episodes calls
-- claim_gate first, in the same transaction: an instance that loaded another
-- definition of the rule gets an error and changes nothing, so two instances in the
-- middle of a rolling reload never close what the other opens.
-- A rule with no row (a database upgraded, not migrated since with the rule) runs on.
-- `definition` holds a short hash per part, not the parts: enough to name what differs,
-- and no action's SQL or webhook in slawatch's tables.
CREATE TABLE slawatch.rule_generation (
    rule         text        PRIMARY KEY,
    generation   text        NOT NULL,
    definition   jsonb       NOT NULL,
    recorded_at  timestamptz NOT NULL
);

-- Called by every claim, sweep and housekeeping statement (slawatch/engine/generation.py).
-- The shared lock is taken first and the row read after it, by a statement of its own
-- (a VOLATILE function's statements each take a new snapshot): a record committed
-- while the caller waited is seen. Held to the caller's commit, it keeps
-- record_generation waiting until no claim made under the old record is in flight; a
-- claim that finds record_generation holding or queued for the lock gives up at once
-- (SWG02: the next scan tries again) rather than wait with its rows locked.
CREATE FUNCTION slawatch.claim_gate(rule text, generation text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    recorded text;
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(hashtextextended('slawatch.generation:' || rule, 0))
    THEN
        RAISE EXCEPTION 'rule %: slawatch migrate is recording its definition', rule
            USING ERRCODE = 'SWG02';
    END IF;
    SELECT g.generation INTO recorded FROM slawatch.rule_generation g WHERE g.rule = claim_gate.rule;
    IF recorded IS NOT NULL AND recorded <> claim_gate.generation THEN
        RAISE EXCEPTION 'rule %: this instance runs definition %, slawatch migrate recorded %',
            rule, generation, recorded
            USING ERRCODE = 'SWG01';
    END IF;
    RETURN true;
END
$$;

-- migrate's record of a rule's definition, under the exclusive form of the gate's lock.
CREATE FUNCTION slawatch.record_generation(rule text, generation text, definition jsonb)
    RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('slawatch.generation:' || rule, 0));
    INSERT INTO slawatch.rule_generation AS g (rule, generation, definition, recorded_at)
    VALUES (rule, generation, definition, now())
    ON CONFLICT ON CONSTRAINT rule_generation_pkey DO UPDATE
       SET generation = excluded.generation, definition = excluded.definition,
           recorded_at = excluded.recorded_at
     WHERE g.generation IS DISTINCT FROM excluded.generation;
END
$$;
