-- A tenant's verified endpoints: every HTTP endpoint created (or given a new URL) without
-- a `verify` of its own is verified. Read with `schema_validation`, in the same row.
ALTER TABLE catalog_settings ADD COLUMN verify_endpoints INTEGER NOT NULL DEFAULT 0;
