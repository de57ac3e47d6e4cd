//! `[plugins]`: the plugin host's settings, with `[plugins.tenant.<tenant>]` limits.

use std::path::{Path, PathBuf};

use super::{ConfigError, RawPlugins, RawTenantPlugins, duration, invalid, raw};
use crate::plugin::{PluginConfig, PluginValues, StructureLimits, TenantLimitOverrides, TenantLimits, is_slug};

/// The most linear memory a 32-bit WebAssembly instance can address, in MiB.
const MAX_MEMORY_MIB: u32 = 4096;

impl RawPlugins {
    /// The plugin host's settings; `max_in_flight_total` sizes the instance pool when
    /// `max_instances` is 0; `dir` and `cache_dir`, when unset, are `plugins.d` and
    /// `plugins.cache` in `data_dir`.
    pub(super) fn validate(self, max_in_flight_total: u32, data_dir: &Path) -> Result<PluginConfig, ConfigError> {
        if self.max_plugins_per_tenant == 0 || self.max_tenant_bytes < self.max_plugin_bytes {
            return Err(invalid(
                "plugins.max_tenant_bytes",
                "a tenant must fit at least one plugin (max_plugins_per_tenant >= 1, max_tenant_bytes >= max_plugin_bytes)",
            ));
        }
        let beside_data = |set: &str, default: &str| match set {
            "" => data_dir.join(default),
            set => PathBuf::from(set),
        };
        let mut c = PluginConfig::new(beside_data(&self.dir, "plugins.d"));
        c.call_timeout = duration("plugins.call_timeout", &self.call_timeout)?;
        c.call_timeout_per_mib = duration("plugins.call_timeout_per_mib", &self.call_timeout_per_mib)?;
        c.memory_limit = (self.memory_limit_mib as usize) << 20;
        c.max_plugin_bytes = self.max_plugin_bytes as usize;
        c.call_threads = self.call_threads as usize;
        c.max_plugins_per_tenant = self.max_plugins_per_tenant as usize;
        c.max_tenant_bytes = self.max_tenant_bytes as usize;
        c.structure = StructureLimits {
            max_function_bytes: self.max_function_bytes as usize,
            max_functions: self.max_functions as usize,
            max_modules: self.max_modules as usize,
        };
        c.cache_dir = Some(beside_data(&self.cache_dir, "plugins.cache"));
        c.compile_concurrency = self.compile_concurrency.max(1) as usize;
        c.compile_timeout = duration("plugins.compile_timeout", &self.compile_timeout)?;
        c.compile_memory = u64::from(self.compile_memory_mib) << 20;
        c.max_instances = match self.max_instances {
            // Warm instances may take half the pool, so the other half must cover every
            // call that can run at once (one per delivery in flight) and the loads and
            // uploads beside them.
            0 => (max_in_flight_total + self.compile_concurrency + 16).saturating_mul(2),
            n => n,
        };
        c.warm_idle = duration("plugins.warm_idle", &self.warm_idle)?;
        c.js_runtime = (!self.js_runtime.is_empty()).then(|| PathBuf::from(&self.js_runtime));
        c.js_memory_limit = (self.js_memory_limit_mib as usize) << 20;
        c.plugin_config = per_plugin(self.config);
        c.plugin_overrides = per_plugin(self.overrides);
        for (tenant, raw) in &self.tenant {
            c.tenant_limits.insert(tenant.clone(), raw.validate(tenant)?);
            fits_one(tenant, &c.limits(tenant))?;
        }
        Ok(c)
    }
}

/// Where the node keeps its data, for the plugin directories' defaults: the directory of
/// an SQLite file (`sqlite:///var/lib/herald/herald.db`: `/var/lib/herald`), else (a
/// file in the working directory, or Postgres, whose data is elsewhere) the working
/// directory.
pub(super) fn data_dir(store_url: &str) -> PathBuf {
    let path = store_url.strip_prefix("sqlite://").or_else(|| store_url.strip_prefix("sqlite:"));
    let path = path.map(|p| p.split('?').next().unwrap_or_default()).unwrap_or_default();
    match Path::new(path).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `<tenant>.<plugin>.<key>` tables as the plugin host keys them.
fn per_plugin(raw: raw::PerPlugin) -> PluginValues {
    PluginValues(
        raw.into_iter()
            .flat_map(|(tenant, plugins)| {
                plugins.into_iter().map(move |(name, kv)| ((tenant.clone(), name), kv.into_iter().collect()))
            })
            .collect(),
    )
}

impl RawTenantPlugins {
    /// Checks one tenant's table like the global keys, naming `plugins.tenant.<tenant>.<key>`.
    fn validate(&self, tenant: &str) -> Result<TenantLimitOverrides, ConfigError> {
        let key = |k: &str| format!("plugins.tenant.{tenant}.{k}");
        if !is_slug(tenant) {
            return Err(invalid(&format!("plugins.tenant.{tenant}"), "a tenant id: 1-64 characters of [a-z0-9_-]"));
        }
        let time = |k: &str, v: &Option<String>| v.as_deref().map(|v| duration(&key(k), v)).transpose();
        let mib = |k: &str, v: Option<u32>| match v {
            Some(n) if n == 0 || n > MAX_MEMORY_MIB => {
                Err(invalid(&key(k), format!("must be 1 to {MAX_MEMORY_MIB} (MiB)")))
            }
            n => Ok(n.map(|n| (n as usize) << 20)),
        };
        let call_timeout = time("call_timeout", &self.call_timeout)?;
        if call_timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid(&key("call_timeout"), "must be positive"));
        }
        if self.max_plugin_bytes == Some(0) {
            return Err(invalid(&key("max_plugin_bytes"), "must be at least 1"));
        }
        Ok(TenantLimitOverrides {
            call_timeout,
            call_timeout_per_mib: time("call_timeout_per_mib", &self.call_timeout_per_mib)?,
            memory_limit: mib("memory_limit_mib", self.memory_limit_mib)?,
            js_memory_limit: mib("js_memory_limit_mib", self.js_memory_limit_mib)?,
            max_plugin_bytes: self.max_plugin_bytes.map(|n| n as usize),
            max_plugins: self.max_plugins.map(|n| n as usize),
            max_tenant_bytes: self.max_tenant_bytes.map(|n| n as usize),
        })
    }
}

/// A tenant must fit at least one plugin, whichever of its limits are its own.
fn fits_one(tenant: &str, l: &TenantLimits) -> Result<(), ConfigError> {
    if l.max_plugins == 0 || l.max_tenant_bytes < l.max_plugin_bytes {
        return Err(invalid(
            &format!("plugins.tenant.{tenant}.max_tenant_bytes"),
            format!(
                "tenant {tenant} must fit at least one plugin: max_plugins is {}, max_tenant_bytes {} and \
                 max_plugin_bytes {} (its own or the [plugins] value)",
                l.max_plugins, l.max_tenant_bytes, l.max_plugin_bytes
            ),
        ));
    }
    Ok(())
}
