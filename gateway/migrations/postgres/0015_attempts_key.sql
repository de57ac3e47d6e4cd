-- An attempt is written once and never updated, and its row cost four b-tree entries: the
-- key on `id`, `attempts_delivery`, `attempts_endpoint` and `attempts_started`. Nothing
-- reads an attempt by its id alone: a delivery's attempts are read by `delivery_id`. So
-- the primary key leads with the delivery and serves those reads, and `attempts_delivery`
-- goes: one index entry fewer per attempt, on the path every delivery takes.
ALTER TABLE attempts DROP CONSTRAINT attempts_pkey;
ALTER TABLE attempts ADD PRIMARY KEY (delivery_id, id);
DROP INDEX attempts_delivery;
