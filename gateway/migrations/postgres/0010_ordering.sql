-- Ordered delivery. An endpoint's `ordering` ('endpoint', 'key'; NULL: unordered) is read
-- by intake's fan-out beside its event types. A delivery's `ordering_key` (NULL: unordered)
-- names the order it goes out in: within one key of one endpoint, in `seq` order, one at a
-- time. `seq` is taken at insert; intake holds a transaction lock per (endpoint, key) first,
-- so two nodes' intakes of one key take their numbers in commit order.
ALTER TABLE endpoints ADD COLUMN ordering TEXT;
ALTER TABLE deliveries ADD COLUMN ordering_key TEXT;
CREATE SEQUENCE deliveries_seq;
ALTER TABLE deliveries ADD COLUMN seq BIGINT;
ALTER TABLE deliveries ALTER COLUMN seq SET DEFAULT nextval('deliveries_seq');
CREATE INDEX deliveries_ordered ON deliveries(endpoint_id, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND state IN ('queued', 'waiting', 'delivering', 'dead');
