-- An endpoint's version: every change to its row raises it, by a trigger, so a change made
-- directly in the database counts as one made through the API. The node reads its running
-- partitions' endpoints' versions in one statement a few times a second and re-reads only
-- the endpoints whose version moved (instead of every busy endpoint every second). The
-- trigger's own update leaves the version changed, so it does not fire again.
ALTER TABLE endpoints ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
CREATE TRIGGER endpoints_version AFTER UPDATE ON endpoints
    FOR EACH ROW WHEN NEW.version = OLD.version
BEGIN
    UPDATE endpoints SET version = OLD.version + 1 WHERE id = NEW.id;
END;
