-- A replay's `sent` counted what it had re-queued: renamed for what it is. What it has
-- sent (attempted since it re-queued it) is read from its deliveries.
ALTER TABLE replays RENAME COLUMN sent TO requeued;
-- A re-queued dead letter's reason and time of death before its replay took it: a cancel
-- puts what the replay had not sent back among the dead letters as it was.
ALTER TABLE deliveries ADD COLUMN prior_reason TEXT;
ALTER TABLE deliveries ADD COLUMN prior_dead_at INTEGER;
-- A tenant's replays are listed newest first; their ids are time-ordered.
DROP INDEX replays_tenant;
CREATE INDEX replays_tenant ON replays(tenant_id, id);
