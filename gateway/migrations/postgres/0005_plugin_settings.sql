-- A tenant's own configuration of each of its plugins (PUT …/plugins/{name}/config).
CREATE TABLE plugin_settings (
    tenant_id   TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    plugin      TEXT COLLATE "C" NOT NULL,
    settings    TEXT NOT NULL,               -- JSON PluginSettings {values, secrets}
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, plugin)
);
