-- Issue 27: storms fold the outbox's rows too (docs/explanation/outbox-rows.md,
-- docs/reference/notifiers.md "storm"). A row's send to a notifier with `storm` set,
-- due and never attempted, counts towards its rule's storm by its alerts; folded, it is
-- settled 'summarized' and points at the summary (today's shape: a slawatch.alert of kind
-- 'summary' with its delivery) by `summary_id`, as a folded delivery does. Its elements
-- an active silence or an ack matched at the fold are recorded in `skipped` as the lease
-- would record them; the others are summarized.
ALTER TABLE slawatch.outbox_send DROP CONSTRAINT outbox_send_status_check;
ALTER TABLE slawatch.outbox_send ADD CONSTRAINT outbox_send_status_check
    CHECK (status IN ('pending', 'sent', 'dead', 'orphaned', 'summarized'));
ALTER TABLE slawatch.outbox_send ADD COLUMN summary_id bigint;
-- A summary's sends in row order: its message lists their first alerts (storm_listing).
CREATE INDEX outbox_send_summary ON slawatch.outbox_send (summary_id, row_id)
    WHERE summary_id IS NOT NULL;
