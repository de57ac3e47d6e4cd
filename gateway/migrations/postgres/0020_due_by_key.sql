-- A claim reads an endpoint's unordered deliveries and its keys' heads apart: the unordered
-- ones in due order from this index, under their NULL key, and the heads from
-- `deliveries_ordered`, each looked up by id. Before, the claim filtered every due delivery
-- of the endpoint by the heads, so one key 100k deep made each claim read 100k rows. The
-- same entries as the index it replaces, with the key between endpoint and due time.
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON deliveries(endpoint_id, ordering_key, next_attempt_at)
    WHERE state IN ('queued', 'waiting');
