-- Ordered delivery. An endpoint's `ordering` ('endpoint', 'key'; NULL: unordered) is read
-- by intake's fan-out beside its event types. A delivery's `ordering_key` (NULL: unordered)
-- names the order it goes out in: within one key of one endpoint, in rowid (intake) order,
-- one at a time.
ALTER TABLE endpoints ADD COLUMN ordering TEXT;
ALTER TABLE deliveries ADD COLUMN ordering_key TEXT;
-- A claim looks for an earlier unfinished delivery of the same key (rowid order is the
-- index's own order within a key). Finished ones leave the index, so the look stays short
-- however long a key has been in use; dead letters stay, for keys that `block` on them.
CREATE INDEX deliveries_ordered ON deliveries(endpoint_id, ordering_key)
    WHERE ordering_key IS NOT NULL AND state IN ('queued', 'waiting', 'delivering', 'dead');
