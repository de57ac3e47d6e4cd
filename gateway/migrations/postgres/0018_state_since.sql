-- Delivery status (issue 51.7): when an endpoint's state last changed, and who changed it:
-- `receiver` (an attempt's verdict: a 429's timed pause, a hold, disabling) or `operator`
-- (the API). Rows written before: NULL, read as unknown.
ALTER TABLE endpoints ADD COLUMN state_since BIGINT;
ALTER TABLE endpoints ADD COLUMN state_by TEXT;
