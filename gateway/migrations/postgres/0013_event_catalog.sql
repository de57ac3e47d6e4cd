-- The event catalog: event types per tenant (owner = the tenant id) and the operator's,
-- which every tenant inherits (owner = ''), each with numbered JSON Schema versions.
CREATE TABLE event_types (
    owner        TEXT COLLATE "C" NOT NULL,
    name         TEXT COLLATE "C" NOT NULL,
    description  TEXT NOT NULL,
    deprecated   BOOLEAN NOT NULL,
    examples     TEXT NOT NULL,               -- JSON array of example payloads
    version      BIGINT NOT NULL,             -- the latest schema's version; 0: no schema
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (owner, name)
);

-- Every version of every type's schema (draft 2020-12), kept when a newer one replaces it.
CREATE TABLE event_type_schemas (
    owner       TEXT COLLATE "C" NOT NULL,
    name        TEXT COLLATE "C" NOT NULL,
    version     BIGINT NOT NULL,
    schema      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (owner, name, version)
);

-- What a tenant's intake does with events that fail its catalog: off, warn, enforce.
CREATE TABLE catalog_settings (
    tenant_id          TEXT COLLATE "C" PRIMARY KEY REFERENCES tenants(id),
    schema_validation  TEXT NOT NULL,
    updated_at         BIGINT NOT NULL
);

-- Raised by every catalog write, so nodes see a change by reading one row.
CREATE TABLE catalog_revision (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    revision  BIGINT NOT NULL
);
INSERT INTO catalog_revision (id, revision) VALUES (1, 0);
