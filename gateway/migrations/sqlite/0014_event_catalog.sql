-- The event catalog: event types per tenant (owner = the tenant id) and the operator's,
-- which every tenant inherits (owner = ''), each with numbered JSON Schema versions.
CREATE TABLE event_types (
    owner        TEXT NOT NULL,
    name         TEXT NOT NULL,
    description  TEXT NOT NULL,
    deprecated   INTEGER NOT NULL,
    examples     TEXT NOT NULL,               -- JSON array of example payloads
    version      INTEGER NOT NULL,             -- the latest schema's version; 0: no schema
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (owner, name)
);

-- Every version of every type's schema (draft 2020-12), kept when a newer one replaces it.
CREATE TABLE event_type_schemas (
    owner       TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    schema      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (owner, name, version)
);

-- What a tenant's intake does with events that fail its catalog: off, warn, enforce.
CREATE TABLE catalog_settings (
    tenant_id          TEXT PRIMARY KEY REFERENCES tenants(id),
    schema_validation  TEXT NOT NULL,
    updated_at         INTEGER NOT NULL
);

-- Raised by every catalog write, so nodes see a change by reading one row.
CREATE TABLE catalog_revision (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    revision  INTEGER NOT NULL
);
INSERT INTO catalog_revision (id, revision) VALUES (1, 0);
