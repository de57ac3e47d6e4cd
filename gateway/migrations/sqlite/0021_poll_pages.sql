-- Pull delivery. A `poll` endpoint's deliveries are stored never due (`next_attempt_at`
-- NULL: no claim takes them); its consumer pages through the unsettled ones in rowid order
-- (the order their intakes committed). Only such deliveries are in this index, so the
-- engine's hot path never writes it; a page reads its rows in order, however deep the
-- endpoint's backlog.
CREATE INDEX deliveries_pull ON deliveries(endpoint_id)
    WHERE state IN ('queued', 'waiting') AND next_attempt_at IS NULL;
