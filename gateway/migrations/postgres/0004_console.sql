-- The console's reads. A delivery listing filtered by endpoint (newest first) and an
-- endpoint's backlog and dead-letter counts read the endpoint's own rows, not the table;
-- endpoint_id and id never change, so only an insert touches this index.
CREATE INDEX deliveries_endpoint ON deliveries(endpoint_id, id);
-- Delivery rate and latency over time (written once per attempt, never updated).
CREATE INDEX attempts_started ON attempts(started_at);
