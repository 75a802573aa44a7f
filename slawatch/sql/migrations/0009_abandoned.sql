-- Rule `give_up_after` (docs/reference/rules.md): an episode open longer than that is ended as
-- abandoned (engine/abandon.py). ended_at is when it was given up; `abandoned` tells it
-- from an episode whose row completed. A constant default: no table rewrite.
ALTER TABLE slawatch.episode ADD COLUMN abandoned boolean NOT NULL DEFAULT false;
-- `status` counts each rule's abandoned episodes (within the retention): few rows.
CREATE INDEX episode_abandoned ON slawatch.episode (rule) WHERE abandoned;
