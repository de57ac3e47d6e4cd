-- An endpoint's version: every change to its row raises it, by a trigger, so a change made
-- directly in the database counts as one made through the API. Each node reads its running
-- partitions' endpoints' versions in one statement a few times a second and re-reads only
-- the endpoints whose version moved (instead of every busy endpoint every second).
ALTER TABLE endpoints ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
CREATE FUNCTION endpoints_next_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END
$$;
CREATE TRIGGER endpoints_version BEFORE UPDATE ON endpoints
    FOR EACH ROW EXECUTE FUNCTION endpoints_next_version();
