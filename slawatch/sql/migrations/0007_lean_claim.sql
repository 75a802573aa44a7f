-- Issue 18: fewer index entries per alert in the claim. The claim writes one episode
-- history row per new episode (engine/outbox.py), and each index on slawatch.episode
-- is one more entry per new episode. episode_open (open episodes by due time) cost one
-- entry per episode for the report's `still` alone, which episode_due answers too:
-- (rule, due_at) with ended_at among its INCLUDE columns, an index-only scan of the
-- rule's episodes due before the report's window (as many as retention keeps).
DROP INDEX slawatch.episode_open;
