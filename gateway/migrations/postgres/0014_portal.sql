-- Portal sessions: a one-time code (in the link) exchanged once for a session token, both
-- kept as sha256 hex only, with the session's scopes, limits and expiry.
CREATE TABLE portal_sessions (
    id           TEXT COLLATE "C" PRIMARY KEY,
    tenant_id    TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    code_hash    TEXT COLLATE "C" UNIQUE,      -- NULL once exchanged
    token_hash   TEXT COLLATE "C" UNIQUE,      -- NULL until exchanged
    scopes       TEXT NOT NULL,                -- space-separated
    read_only    BOOLEAN NOT NULL,
    endpoints    TEXT,                         -- JSON array of endpoint ids; NULL: all
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    exchanged_at BIGINT,
    revoked_at   BIGINT
);
CREATE INDEX portal_sessions_tenant ON portal_sessions (tenant_id, created_at);

-- A tenant's portal branding: shown as text and a CSS colour only.
CREATE TABLE tenant_branding (
    tenant_id   TEXT COLLATE "C" PRIMARY KEY REFERENCES tenants(id),
    name        TEXT NOT NULL,
    logo        TEXT NOT NULL,                 -- a data: URL, or '' for none
    accent      TEXT NOT NULL,                 -- #rrggbb, or '' for the default
    updated_at  BIGINT NOT NULL
);
