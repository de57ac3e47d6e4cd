-- Verified endpoints: where an endpoint's handshake stands (JSON `Verification`: state,
-- the URL it stands for, reason, last_tried_at, next_try_at, failures); NULL: never tried.
-- Written by the node holding the endpoint's partition lease and by "verify now".
ALTER TABLE endpoints ADD COLUMN verification TEXT;
