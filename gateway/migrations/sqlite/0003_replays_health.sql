-- Replays: a replayed delivery counts its retries from `attempt_base` and gets a fresh
-- `deadline`; `replay_id` ties it to the replay that re-queued it.
ALTER TABLE deliveries ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deliveries ADD COLUMN deadline INTEGER;
ALTER TABLE deliveries ADD COLUMN replay_id TEXT;
CREATE INDEX deliveries_replay ON deliveries(replay_id, state) WHERE replay_id IS NOT NULL;
CREATE INDEX deliveries_finished ON deliveries(state, updated_at) WHERE state IN ('delivered', 'dead');

-- Endpoint health reads attempts by endpoint and time.
ALTER TABLE attempts ADD COLUMN endpoint_id TEXT;
CREATE INDEX attempts_endpoint ON attempts(endpoint_id, started_at);

CREATE TABLE replays (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    state        TEXT NOT NULL,              -- running | done | cancelled
    ids          TEXT,                       -- JSON array of delivery ids, or NULL
    filter       TEXT,                       -- JSON DeliveryFilter, or NULL
    rate_per_sec REAL NOT NULL,
    batch        INTEGER NOT NULL,
    selected     INTEGER NOT NULL,
    sent         INTEGER NOT NULL DEFAULT 0,
    cursor       TEXT NOT NULL DEFAULT '',   -- last delivery id re-queued
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX replays_tenant ON replays(tenant_id, created_at);
