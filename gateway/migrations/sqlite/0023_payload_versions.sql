-- Pinned payload versions (issue 51.5).
--
-- The version of its type's schema an event was posted against: the latest version of
-- the type in the tenant's catalog at intake; NULL when the type had no schema. An
-- endpoint that pins an older version (its `payload_versions`) gets the payload
-- converted down from this one.
ALTER TABLE events ADD COLUMN schema_version INTEGER;

-- An event type's adapters: a JSON array of {"from", "to", "plugin"}, the plugins whose
-- `transform` converts a payload of one version of its schema to an older one.
ALTER TABLE event_types ADD COLUMN adapters TEXT NOT NULL DEFAULT '[]';
