-- The audit log: one entry per write through the API, inserted in the change's own
-- transaction. `fields` names what the request set (a JSON array), never a value.
CREATE TABLE audit_log (
    id          TEXT COLLATE "C" PRIMARY KEY,  -- au_ + time-ordered: the listing's order and cursor
    at          BIGINT NOT NULL,
    actor       TEXT COLLATE "C" NOT NULL,     -- admin, token:<id>, portal:<session id>
    tenant_id   TEXT COLLATE "C",              -- NULL: an operator-wide write
    route       TEXT COLLATE "C" NOT NULL,     -- method and path template
    kind        TEXT COLLATE "C" NOT NULL,
    resource_id TEXT COLLATE "C",
    fields      TEXT NOT NULL,
    client      TEXT
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id);
CREATE INDEX audit_log_actor ON audit_log (actor, id);
CREATE INDEX audit_log_resource ON audit_log (kind, resource_id, id);
CREATE INDEX audit_log_route ON audit_log (route, id);
