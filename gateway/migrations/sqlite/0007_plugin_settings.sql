-- A tenant's own configuration of each of its plugins (PUT …/plugins/{name}/config).
CREATE TABLE plugin_settings (
    tenant_id   TEXT NOT NULL REFERENCES tenants(id),
    plugin      TEXT NOT NULL,
    settings    TEXT NOT NULL,               -- JSON PluginSettings {values, secrets}
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, plugin)
);
