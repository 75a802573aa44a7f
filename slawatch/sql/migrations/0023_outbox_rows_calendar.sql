-- Issue 27: the outbox in rows (0020_outbox_rows.sql; docs/explanation/outbox-rows.md) for
-- what its preview refused or did otherwise than today's outbox.
--
-- A calendar rule counts `after` in working time (docs/reference/rules.md, `calendar`), so
-- each alert's due time is its own: a row of such a rule has no `after` and the due time
-- of element i in due_ats[i] (NULL where the deadline is not finite, as an alert's
-- due_at). Every reader takes an element's due time as
-- coalesce(due_ats[i], deadlines[i] + after). The claim writes due_ats with NULL
-- elements and the due times before it commits (engine/claim.py, _dated), as it gives
-- today's alerts theirs. A nullable column and a CHECK that the existing rows pass:
-- no rewrite, one read of the table.
ALTER TABLE slawatch.outbox_row
    ALTER COLUMN after DROP NOT NULL,
    ADD COLUMN due_ats timestamptz[],
    ADD CONSTRAINT outbox_row_due CHECK (
        (after IS NOT NULL OR due_ats IS NOT NULL)
        AND (due_ats IS NULL OR cardinality(due_ats) = cardinality(keys)));

-- A resolved notice in rows is written by the statement that ends its episode in the
-- history; an episode given up (give_up_after, `abandoned`) was ended without a notice,
-- and gets its notice when its row completes, as with today's outbox. The claims and
-- sweeps that write resolved notices in rows set this from NULL (once per episode,
-- whoever writes it; engine/outbox.py). Not indexed: found by episode_pkey, as ever.
ALTER TABLE slawatch.episode ADD COLUMN resolved_notice_at timestamptz;
