-- A replay's pace, shared by every node that runs it: when its next batch is due. A node
-- re-queues a batch only once this time has come, and moves it on by the batch's span at
-- the replay's rate, so several nodes running one replay take turns instead of each
-- adding its own rate. 0: due at once (a new replay, or one from before this migration).
ALTER TABLE replays ADD COLUMN next_due_at BIGINT NOT NULL DEFAULT 0;
