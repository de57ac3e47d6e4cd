-- Herald schema (SQLite). Instants are INTEGER milliseconds since the Unix epoch.
CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE tokens (
    hash        TEXT PRIMARY KEY,            -- sha256 hex of the bearer token
    tenant_id   TEXT NOT NULL REFERENCES tenants(id),
    scopes      TEXT NOT NULL,               -- space-separated
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE endpoints (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants(id),
    spec          TEXT NOT NULL,             -- JSON EndpointSpec
    event_types   TEXT NOT NULL,             -- JSON array, read by intake fan-out
    state         TEXT NOT NULL,             -- active | paused | disabled
    state_reason  TEXT,
    paused_until  INTEGER,
    failing_since INTEGER,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX endpoints_tenant ON endpoints(tenant_id, created_at);

CREATE TABLE events (
    tenant_id   TEXT NOT NULL REFERENCES tenants(id),
    id          TEXT NOT NULL,
    type        TEXT NOT NULL,
    payload     TEXT NOT NULL,               -- bytes exactly as received
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, id)
) STRICT, WITHOUT ROWID;

CREATE TABLE deliveries (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    endpoint_id     TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    lease_owner     TEXT,
    lease_until     INTEGER,
    fence           INTEGER NOT NULL DEFAULT 0,
    reason          TEXT,
    last_status     INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX deliveries_event ON deliveries(tenant_id, event_id);
CREATE INDEX deliveries_due ON deliveries(endpoint_id, next_attempt_at) WHERE state IN ('queued', 'waiting');
CREATE INDEX deliveries_leased ON deliveries(lease_until) WHERE state = 'delivering';
CREATE INDEX deliveries_dead ON deliveries(tenant_id, updated_at) WHERE state = 'dead';

CREATE TABLE attempts (
    id            TEXT PRIMARY KEY,
    delivery_id   TEXT NOT NULL,
    number        INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    duration_ms   INTEGER NOT NULL,
    status        INTEGER,
    response_body TEXT,
    error         TEXT,
    verdict       TEXT NOT NULL,
    decided_by    TEXT NOT NULL
) STRICT;
CREATE INDEX attempts_delivery ON attempts(delivery_id, number);
