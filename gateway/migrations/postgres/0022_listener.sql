-- `herald listen`: the node that last took an endpoint's listener connection (kind
-- `listen`), which paces the endpoint from then on; NULL: never connected. Written by that
-- node when the listener connects (the version trigger tells the other nodes).
ALTER TABLE endpoints ADD COLUMN listener TEXT;
