//! The first layer: the configuration as written (TOML sections and keys, every key
//! optional, defaults filled by serde). The defaults are also the list of keys that
//! `HERALD_<SECTION>_<KEY>` variables may set. `config` validates this into `Config`.

use serde::{Deserialize, Serialize};

/// The configuration as written: every key optional, defaults filled by serde.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub server: RawServer,
    pub store: RawStore,
    pub intake: RawIntake,
    pub delivery: RawDelivery,
    pub retry: RawRetry,
    pub endpoint_defaults: RawEndpointDefaults,
    pub plugins: RawPlugins,
    pub operator: RawOperator,
    pub retention: RawRetention,
    pub cluster: RawCluster,
    pub log: RawLog,
    pub secrets: RawSecrets,
    pub tracing: RawTracing,
    pub portal: RawPortal,
    /// `[[outbox]]`: an array of tables, so after every plain section.
    pub outbox: Vec<super::RawOutbox>,
}

/// `[secrets]`: the operator's key that seals stored secrets (mTLS client keys): base64 of
/// 32 bytes. `previous_keys` still open what older keys sealed, during a rotation.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSecrets {
    pub key: String,
    pub previous_keys: Vec<String>,
}

impl std::fmt::Debug for RawSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawSecrets {{ key: <redacted>, previous_keys: {} }}", self.previous_keys.len())
    }
}

/// `[portal]`: the embeddable customer portal (`config::portal`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPortal {
    pub frame_ancestors: Vec<String>,
    pub public_url: String,
    pub plugins: bool,
    pub min_ttl_secs: u64,
}

impl Default for RawPortal {
    fn default() -> Self {
        Self { frame_ancestors: Vec::new(), public_url: String::new(), plugins: false, min_ttl_secs: 60 }
    }
}

/// `[tracing]`: OpenTelemetry span export (off while `otlp_endpoint` is empty).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTracing {
    pub otlp_endpoint: String,
    pub sample_ratio: f64,
    pub service_name: String,
}

impl Default for RawTracing {
    fn default() -> Self {
        Self { otlp_endpoint: String::new(), sample_ratio: 1.0, service_name: "herald".into() }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawOperator {
    pub url: String,
    pub secret: String,
    pub stale_after: String,
    pub check_every: String,
}

impl Default for RawOperator {
    fn default() -> Self {
        Self { url: String::new(), secret: String::new(), stale_after: "1h".into(), check_every: "1m".into() }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetention {
    pub delivered: String,
    pub dead: String,
    pub every: String,
    pub batch: u32,
}

impl Default for RawRetention {
    fn default() -> Self {
        Self { delivered: "7d".into(), dead: "30d".into(), every: "1m".into(), batch: 1000 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    pub listen: String,
    pub admin_listen: String,
    pub admin_token: String,
    pub max_payload_bytes: u64,
    pub header_read_timeout: String,
    pub body_read_timeout: String,
    pub idle_timeout: String,
    pub max_connections: u32,
    pub worker_threads: u32,
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_listen: String::new(),
            admin_token: String::new(),
            max_payload_bytes: 1 << 20,
            header_read_timeout: "10s".into(),
            body_read_timeout: "10s".into(),
            idle_timeout: "60s".into(),
            max_connections: 512,
            worker_threads: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    pub url: String,
    pub max_connections: u32,
}

impl Default for RawStore {
    fn default() -> Self {
        Self { url: "sqlite://herald.db".into(), max_connections: 8 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawIntake {
    pub max_batch: u32,
    pub max_events_per_request: u32,
}

impl Default for RawIntake {
    fn default() -> Self {
        Self { max_batch: 1024, max_events_per_request: 1000 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDelivery {
    pub allow_private_destinations: bool,
    pub connect_timeout: String,
    pub timeout: String,
    pub lease_margin: String,
    pub disable_after: String,
    pub max_in_flight_total: u32,
    pub secret_grace: String,
    /// `http://[user:pass@]host:port`: an HTTP CONNECT proxy every delivery goes through
    /// (empty: none).
    pub proxy: String,
    /// Comma-separated destinations that bypass `proxy`: names (and their subdomains),
    /// `.suffixes`, IP addresses, CIDRs, or `*`.
    pub no_proxy: String,
}

impl Default for RawDelivery {
    fn default() -> Self {
        Self {
            allow_private_destinations: false,
            connect_timeout: "3s".into(),
            timeout: "10s".into(),
            lease_margin: "30s".into(),
            disable_after: "24h".into(),
            max_in_flight_total: 1024,
            secret_grace: "24h".into(),
            proxy: String::new(),
            no_proxy: String::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetry {
    pub base: String,
    pub factor: f64,
    pub cap: String,
    pub jitter: String,
    pub max_attempts: u32,
    pub ttl: String,
}

impl Default for RawRetry {
    fn default() -> Self {
        Self {
            base: "30s".into(),
            factor: 2.0,
            cap: "6h".into(),
            jitter: "full".into(),
            max_attempts: 10,
            ttl: "24h".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawEndpointDefaults {
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
}

impl Default for RawEndpointDefaults {
    fn default() -> Self {
        Self { rate_per_sec: 10.0, burst: 10, max_in_flight: 4 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPlugins {
    /// Empty: `plugins.d` beside the data (see `config::plugins`).
    pub dir: String,
    pub call_timeout: String,
    pub call_timeout_per_mib: String,
    pub memory_limit_mib: u32,
    pub max_plugin_bytes: u64,
    pub call_threads: u32,
    pub max_plugins_per_tenant: u32,
    pub max_tenant_bytes: u64,
    pub max_function_bytes: u64,
    pub max_functions: u32,
    pub max_modules: u32,
    /// Empty: `plugins.cache` beside the data.
    pub cache_dir: String,
    pub compile_concurrency: u32,
    pub compile_timeout: String,
    pub compile_memory_mib: u32,
    pub max_instances: u32,
    pub warm_idle: String,
    pub js_runtime: String,
    pub js_memory_limit_mib: u32,
    /// `[plugins.config.<tenant>.<plugin>]`: each plugin's default settings.
    pub config: PerPlugin,
    /// `[plugins.override.<tenant>.<plugin>]`: settings a tenant cannot change.
    #[serde(rename = "override")]
    pub overrides: PerPlugin,
    /// `[plugins.tenant.<tenant>]`: one tenant's own limits.
    pub tenant: std::collections::BTreeMap<String, RawTenantPlugins>,
}

/// `[plugins.tenant.<tenant>]`: limits the operator sets for one tenant; each key left
/// out follows the `[plugins]` value (`max_plugins` follows `max_plugins_per_tenant`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTenantPlugins {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_timeout_per_mib: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_mib: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub js_memory_limit_mib: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_plugin_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_plugins: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tenant_bytes: Option<u64>,
}

/// `<tenant>.<plugin>.<key> = "value"`.
pub type PerPlugin =
    std::collections::BTreeMap<String, std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>>;

impl Default for RawPlugins {
    fn default() -> Self {
        Self {
            dir: String::new(),
            call_timeout: "10ms".into(),
            call_timeout_per_mib: "100ms".into(),
            memory_limit_mib: 16,
            max_plugin_bytes: 8 << 20,
            call_threads: 0,
            max_plugins_per_tenant: 20,
            max_tenant_bytes: 32 << 20,
            max_function_bytes: 512 << 10,
            max_functions: 20_000,
            max_modules: 16,
            cache_dir: String::new(),
            compile_concurrency: 1,
            compile_timeout: "20s".into(),
            compile_memory_mib: 512,
            max_instances: 0,
            warm_idle: "30s".into(),
            js_runtime: String::new(),
            js_memory_limit_mib: 64,
            config: Default::default(),
            overrides: Default::default(),
            tenant: Default::default(),
        }
    }
}

/// `[cluster]`: how this node names itself in the store's leases.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCluster {
    /// Empty: derived from the host name (see `config::NodeId`).
    pub node_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    pub level: String,
    pub format: String,
}

impl Default for RawLog {
    fn default() -> Self {
        Self { level: "info".into(), format: "text".into() }
    }
}
