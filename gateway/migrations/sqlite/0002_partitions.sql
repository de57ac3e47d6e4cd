-- Endpoint partitions are leased to one node at a time, so pacing holds for a cluster.
CREATE TABLE partitions (
    endpoint_id TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    lease_until INTEGER NOT NULL
) STRICT;
