-- The cluster's members: each node writes its row every second (`seen_at` by the
-- database's clock, so the nodes' clocks do not matter) and deletes it when it drains.
-- Nodes seen within the member timeout share the endpoints (rendezvous hashing over their
-- ids); the others' endpoints go to the rest.
CREATE TABLE cluster_nodes (
    node_id TEXT PRIMARY KEY,
    seen_at TIMESTAMPTZ NOT NULL
);
