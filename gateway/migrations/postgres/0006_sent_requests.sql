-- What each attempt sent (issue 16): the headers as a JSON array of [name, value] pairs,
-- the body only when a transform changed it (NULL: Herald's envelope of the event's stored
-- payload, not stored twice), cut at 64 KiB, and the size of the body as sent. All NULL for
-- an attempt that sent nothing and for attempts recorded before this migration.
ALTER TABLE attempts ADD COLUMN request_headers TEXT;
ALTER TABLE attempts ADD COLUMN request_body TEXT;
ALTER TABLE attempts ADD COLUMN request_body_size BIGINT;
