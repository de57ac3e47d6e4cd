//! Plugin settings as calls read them (the operator's defaults, a tenant's own settings,
//! the operator's overrides) and how a plugin's calls went, per (tenant, name).

use super::*;

impl PluginHost {
    /// (tenant, plugin, p50, p99) in seconds, for every plugin called since start.
    pub fn latencies(&self) -> Vec<(String, String, f64, f64)> {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        let plugins = tenants.iter().flat_map(|(t, p)| p.iter().map(move |(n, slot)| (t, n, slot)));
        plugins
            .filter_map(|(t, n, slot)| {
                let s = slot.stats.snapshot();
                Some((t.clone(), n.clone(), s.p50?.as_secs_f64(), s.p99?.as_secs_f64()))
            })
            .collect()
    }

    /// The figures of `tenant`'s plugin `name` since the node started.
    pub fn stats(&self, tenant: &str, name: &str) -> Option<PluginStats> {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        Some(tenants.get(tenant)?.get(name)?.stats.snapshot())
    }

    /// What (tenant, name) reads: the operator's defaults, then the tenant's own
    /// settings, then the operator's overrides, each replacing the keys it sets.
    pub(super) fn plugin_config(&self, tenant: &str, name: &str) -> HashMap<String, String> {
        // A pinned `name@n` reads the settings of `name`.
        let name = split_pinned(name).map_or(name, |(base, _)| base);
        let key = (tenant.to_string(), name.to_string());
        let mut config = self.inner.config.plugin_config.get(&key).cloned().unwrap_or_default();
        let own = self.inner.tenant_config.read().unwrap_or_else(|e| e.into_inner());
        config.extend(own.get(&key).into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        let overrides = self.inner.config.plugin_overrides.get(&key);
        config.extend(overrides.into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        config
    }

    /// Sets `tenant`'s own settings of its plugin `name` (empty: none). Calls that start
    /// afterwards read them; calls in flight finish with what they started with. No
    /// compile: the serving version is re-derived with the new map. Returns whether
    /// anything changed.
    pub fn set_tenant_config(&self, tenant: &str, name: &str, settings: HashMap<String, String>) -> bool {
        let key = (tenant.to_string(), name.to_string());
        {
            let mut own = self.inner.tenant_config.write().unwrap_or_else(|e| e.into_inner());
            let old = own.get(&key);
            if old.map_or(settings.is_empty(), |old| *old == settings) {
                return false;
            }
            if settings.is_empty() {
                own.remove(&key)
            } else {
                own.insert(key, settings)
            };
        }
        let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
        let config = self.plugin_config(tenant, name);
        let slots = tenants.get_mut(tenant).into_iter().flatten();
        // The plugin and its pinned versions.
        let slots = slots.filter(|(key, _)| *key == name || split_pinned(key).is_some_and(|(base, _)| base == name));
        for (_, slot) in slots {
            if let Some(current) = &slot.current {
                slot.current = Some(Arc::new(current.with_config(config.clone())));
            }
        }
        tracing::info!(tenant, plugin = name, "plugin settings changed");
        true
    }

    /// The keys of (tenant, name) that the operator's overrides fix, sorted.
    pub fn overridden_keys(&self, tenant: &str, name: &str) -> Vec<String> {
        let key = (tenant.to_string(), name.to_string());
        let mut keys: Vec<String> =
            self.inner.config.plugin_overrides.get(&key).into_iter().flat_map(|m| m.keys().cloned()).collect();
        keys.sort();
        keys
    }
}
