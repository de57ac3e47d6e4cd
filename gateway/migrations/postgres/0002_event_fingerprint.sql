-- sha256 hex of an event's type and payload: a re-post of the same id with a different
-- type or payload is a conflict, not a duplicate. NULL for events stored before this
-- column existed (their type and payload are compared instead).
ALTER TABLE events ADD COLUMN fingerprint TEXT;
