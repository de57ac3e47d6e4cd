-- A delivery delivered by its first attempt keeps that attempt in its own row instead of an
-- `attempts` row (issue 53.0): the result's update writes these columns, and the reads of
-- attempts (a delivery's history, the console's series and endpoint health) add the attempt
-- they describe, with the delivery's `last_status` and `last_error` as its status and
-- error and 1 as its number. A delivered row is final, so they never change. The attempt
-- row cost a table row and its index entries on the path every delivery takes; these
-- columns cost none. NULL `first_attempt_id`: the delivery's attempts are all in
-- `attempts` (every delivery written before this migration, and every one that needed a
-- retry or is not finished).
ALTER TABLE deliveries ADD COLUMN first_attempt_id TEXT;
ALTER TABLE deliveries ADD COLUMN first_started_at INTEGER;
ALTER TABLE deliveries ADD COLUMN first_duration_ms INTEGER;
ALTER TABLE deliveries ADD COLUMN first_response_body TEXT;
ALTER TABLE deliveries ADD COLUMN first_verdict TEXT;
ALTER TABLE deliveries ADD COLUMN first_decided_by TEXT;
ALTER TABLE deliveries ADD COLUMN first_request_headers TEXT;
ALTER TABLE deliveries ADD COLUMN first_request_body TEXT;
ALTER TABLE deliveries ADD COLUMN first_request_body_size INTEGER;

-- And the key of `attempts` leads with the delivery, as on Postgres since its 0015: nothing
-- reads an attempt by its id alone, a delivery's attempts are read by `delivery_id`, so the
-- key serves those reads and `attempts_delivery` goes, one b-tree entry fewer for each
-- attempt that still gets a row. SQLite changes a primary key only by rebuilding the table.
CREATE TABLE attempts_keyed (
    id                TEXT NOT NULL,
    delivery_id       TEXT NOT NULL,
    number            INTEGER NOT NULL,
    started_at        INTEGER NOT NULL,
    duration_ms       INTEGER NOT NULL,
    status            INTEGER,
    response_body     TEXT,
    error             TEXT,
    verdict           TEXT NOT NULL,
    decided_by        TEXT NOT NULL,
    endpoint_id       TEXT,
    request_headers   TEXT,
    request_body      TEXT,
    request_body_size INTEGER,
    PRIMARY KEY (delivery_id, id)
) STRICT;
INSERT INTO attempts_keyed SELECT id, delivery_id, number, started_at, duration_ms, status, response_body, error,
    verdict, decided_by, endpoint_id, request_headers, request_body, request_body_size FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_keyed RENAME TO attempts;
CREATE INDEX attempts_endpoint ON attempts(endpoint_id, started_at);
CREATE INDEX attempts_started ON attempts(started_at);
