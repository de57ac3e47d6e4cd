-- Herald schema (Postgres). Instants are BIGINT milliseconds since the Unix epoch. Ids are
-- compared bytewise (COLLATE "C"): delivery ids are time-ordered and page by `id > after`.
CREATE TABLE tenants (
    id          TEXT COLLATE "C" PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE tokens (
    hash        TEXT COLLATE "C" PRIMARY KEY,  -- sha256 hex of the bearer token
    tenant_id   TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    scopes      TEXT NOT NULL,                 -- space-separated
    created_at  BIGINT NOT NULL
);

CREATE TABLE endpoints (
    id            TEXT COLLATE "C" PRIMARY KEY,
    tenant_id     TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    spec          TEXT NOT NULL,               -- JSON EndpointSpec
    event_types   TEXT NOT NULL,               -- JSON array, read by intake fan-out
    state         TEXT NOT NULL,               -- active | paused | disabled
    state_reason  TEXT,
    paused_until  BIGINT,
    failing_since BIGINT,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
CREATE INDEX endpoints_tenant ON endpoints(tenant_id, created_at);

CREATE TABLE events (
    tenant_id   TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    id          TEXT COLLATE "C" NOT NULL,
    type        TEXT NOT NULL,
    payload     TEXT NOT NULL,                 -- bytes exactly as received
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE deliveries (
    id              TEXT COLLATE "C" PRIMARY KEY,
    tenant_id       TEXT COLLATE "C" NOT NULL,
    event_id        TEXT COLLATE "C" NOT NULL,
    endpoint_id     TEXT COLLATE "C" NOT NULL,
    event_type      TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    lease_owner     TEXT,
    lease_until     BIGINT,
    fence           BIGINT NOT NULL DEFAULT 0,
    reason          TEXT,
    last_status     BIGINT,
    last_error      TEXT,
    attempt_base    BIGINT NOT NULL DEFAULT 0,  -- a replayed delivery counts retries from here
    deadline        BIGINT,                     -- set by a replay, replacing the event's
    replay_id       TEXT COLLATE "C",           -- the replay that re-queued it
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX deliveries_event ON deliveries(tenant_id, event_id);
CREATE INDEX deliveries_due ON deliveries(endpoint_id, next_attempt_at) WHERE state IN ('queued', 'waiting');
CREATE INDEX deliveries_leased ON deliveries(lease_until) WHERE state = 'delivering';
CREATE INDEX deliveries_dead ON deliveries(tenant_id, updated_at) WHERE state = 'dead';
CREATE INDEX deliveries_replay ON deliveries(replay_id, state) WHERE replay_id IS NOT NULL;
CREATE INDEX deliveries_finished ON deliveries(state, updated_at) WHERE state IN ('delivered', 'dead');

CREATE TABLE attempts (
    id            TEXT COLLATE "C" PRIMARY KEY,
    delivery_id   TEXT COLLATE "C" NOT NULL,
    number        BIGINT NOT NULL,
    started_at    BIGINT NOT NULL,
    duration_ms   BIGINT NOT NULL,
    status        BIGINT,
    response_body TEXT,
    error         TEXT,
    verdict       TEXT NOT NULL,
    decided_by    TEXT NOT NULL,
    endpoint_id   TEXT COLLATE "C"             -- endpoint health reads attempts by endpoint
);
CREATE INDEX attempts_delivery ON attempts(delivery_id, number);
CREATE INDEX attempts_endpoint ON attempts(endpoint_id, started_at);

-- Endpoint partitions are leased to one node at a time, so pacing holds for a cluster.
CREATE TABLE partitions (
    endpoint_id TEXT COLLATE "C" PRIMARY KEY,
    owner       TEXT NOT NULL,
    lease_until BIGINT NOT NULL
);

CREATE TABLE replays (
    id           TEXT COLLATE "C" PRIMARY KEY,
    tenant_id    TEXT COLLATE "C" NOT NULL,
    state        TEXT NOT NULL,                -- running | done | cancelled
    ids          TEXT,                         -- JSON array of delivery ids, or NULL
    filter       TEXT,                         -- JSON filter, or NULL
    rate_per_sec DOUBLE PRECISION NOT NULL,
    batch        BIGINT NOT NULL,
    selected     BIGINT NOT NULL,
    sent         BIGINT NOT NULL DEFAULT 0,
    cursor       TEXT COLLATE "C" NOT NULL DEFAULT '',  -- last delivery id re-queued
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE INDEX replays_tenant ON replays(tenant_id, created_at);
