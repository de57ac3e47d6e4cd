-- The audit log: one entry per write through the API, inserted in the change's own
-- transaction. `fields` names what the request set (a JSON array), never a value.
CREATE TABLE audit_log (
    id          TEXT PRIMARY KEY,              -- au_ + time-ordered: the listing's order and cursor
    at          INTEGER NOT NULL,
    actor       TEXT NOT NULL,                 -- admin, token:<id>, portal:<session id>
    tenant_id   TEXT,                          -- NULL: an operator-wide write
    route       TEXT NOT NULL,                 -- method and path template
    kind        TEXT NOT NULL,
    resource_id TEXT,
    fields      TEXT NOT NULL,
    client      TEXT
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id);
CREATE INDEX audit_log_actor ON audit_log (actor, id);
CREATE INDEX audit_log_resource ON audit_log (kind, resource_id, id);
CREATE INDEX audit_log_route ON audit_log (route, id);
