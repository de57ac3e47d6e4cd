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
ALTER TABLE deliveries ADD COLUMN first_started_at BIGINT;
ALTER TABLE deliveries ADD COLUMN first_duration_ms BIGINT;
ALTER TABLE deliveries ADD COLUMN first_response_body TEXT;
ALTER TABLE deliveries ADD COLUMN first_verdict TEXT;
ALTER TABLE deliveries ADD COLUMN first_decided_by TEXT;
ALTER TABLE deliveries ADD COLUMN first_request_headers TEXT;
ALTER TABLE deliveries ADD COLUMN first_request_body TEXT;
ALTER TABLE deliveries ADD COLUMN first_request_body_size BIGINT;
