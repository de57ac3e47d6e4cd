//! Configuration in two layers: `RawConfig` (TOML + `HERALD_<SECTION>_<KEY>` overrides, as
//! written) is validated into `Config` (typed, checked). This module never touches the
//! process environment itself: callers pass the variables in.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::{Jitter, RetryPolicy};

/// A configuration problem, naming the key and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config key `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), reason: reason.into() }
}

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
    pub log: RawLog,
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
    pub admin_token: String,
    pub max_payload_bytes: u64,
    pub header_read_timeout: String,
    pub idle_timeout: String,
    pub max_connections: u32,
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_token: String::new(),
            max_payload_bytes: 1 << 20,
            header_read_timeout: "10s".into(),
            idle_timeout: "60s".into(),
            max_connections: 512,
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
    pub dir: String,
    pub call_timeout: String,
    pub memory_limit_mib: u32,
    pub max_plugin_bytes: u64,
    pub call_threads: u32,
    pub max_plugins_per_tenant: u32,
    pub max_tenant_bytes: u64,
    pub max_function_bytes: u64,
    pub max_functions: u32,
    pub max_modules: u32,
    pub cache_dir: String,
    pub compile_concurrency: u32,
    pub compile_timeout: String,
    pub compile_memory_mib: u32,
    pub max_instances: u32,
    pub warm_idle: String,
    /// `[plugins.config.<tenant>.<plugin>]`: each plugin's own settings.
    pub config: std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    >,
}

impl Default for RawPlugins {
    fn default() -> Self {
        Self {
            dir: "plugins.d".into(),
            call_timeout: "10ms".into(),
            memory_limit_mib: 16,
            max_plugin_bytes: 8 << 20,
            call_threads: 0,
            max_plugins_per_tenant: 20,
            max_tenant_bytes: 32 << 20,
            max_function_bytes: 512 << 10,
            max_functions: 20_000,
            max_modules: 16,
            cache_dir: "plugins.cache".into(),
            compile_concurrency: 1,
            compile_timeout: "20s".into(),
            compile_memory_mib: 512,
            max_instances: 0,
            warm_idle: "30s".into(),
            config: Default::default(),
        }
    }
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

/// The validated configuration the rest of Herald reads. Its `Debug` (what
/// `herald check-config` prints) shows no secret: they are [`Redacted`] or [`StoreUrl`].
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// `None`: admin routes refuse every request.
    pub admin_token: Option<Redacted>,
    pub max_payload_bytes: usize,
    pub server: ServerLimits,
    pub store_url: StoreUrl,
    pub store_max_connections: u32,
    pub intake_max_batch: usize,
    pub max_events_per_request: usize,
    pub delivery: DeliveryConfig,
    pub retry: RetryPolicy,
    pub endpoint_defaults: EndpointDefaults,
    pub plugins: PluginsConfig,
    pub operator: OperatorConfig,
    pub retention: RetentionConfig,
    pub log_level: String,
    pub log_json: bool,
}

/// How the API listener treats connections: every one must send its request head within
/// `header_read_timeout`, an idle keep-alive connection is closed after `idle_timeout`, and
/// at most `max_connections` are served at once (the rest wait in the kernel's backlog).
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// A secret from the configuration: usable through [`Redacted::expose`], never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(String);

impl Redacted {
    pub fn new(secret: impl Into<String>) -> Self {
        Redacted(secret.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// The store URL: reads as the full URL (`Deref<Target = str>`), prints (`Display`,
/// `Debug`) without its password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl(String);

impl StoreUrl {
    pub fn new(url: impl Into<String>) -> Self {
        StoreUrl(url.into())
    }

    /// The URL with any password (in the userinfo or a `password` query parameter) masked.
    pub fn redacted(&self) -> String {
        let Ok(mut url) = url::Url::parse(&self.0) else { return self.0.clone() };
        if url.password().is_some() {
            let _ = url.set_password(Some("***"));
        }
        if url.query_pairs().any(|(k, _)| k.eq_ignore_ascii_case("password")) {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k.eq_ignore_ascii_case("password") { "***".into() } else { v.into_owned() };
                    (k.into_owned(), v)
                })
                .collect();
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        url.to_string()
    }
}

impl std::ops::Deref for StoreUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

/// Where operational events go (`url: None`: nowhere) and when dead letters are stale.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    pub url: Option<String>,
    pub secret: Redacted,
    pub stale_after: Duration,
    pub check_every: Duration,
}

/// How long finished deliveries are kept, and how purging proceeds.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub delivered: Duration,
    pub dead: Duration,
    pub every: Duration,
    pub batch: u32,
}

#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    pub allow_private_destinations: bool,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub lease_margin: Duration,
    pub disable_after: Duration,
    pub max_in_flight_total: usize,
    pub secret_grace: Duration,
}

#[derive(Debug, Clone, Copy)]
pub struct EndpointDefaults {
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
}

#[derive(Debug, Clone)]
pub struct PluginsConfig {
    pub dir: PathBuf,
    pub call_timeout: Duration,
    pub memory_limit_bytes: usize,
    pub max_plugin_bytes: usize,
    /// Threads of the plugin call pool; 0: one per CPU, at least 2.
    pub call_threads: usize,
    pub max_plugins_per_tenant: usize,
    pub max_tenant_bytes: usize,
    pub structure: crate::plugin::StructureLimits,
    pub cache_dir: PathBuf,
    /// The `herald` binary that compiles plugins in a child process; set by `herald
    /// serve` (not a config key). `None`: compile in this process.
    pub compiler_exe: Option<PathBuf>,
    pub compile_concurrency: usize,
    pub compile_timeout: Duration,
    pub compile_memory_bytes: u64,
    /// Instance pool slots, sized from the limits when the key is 0.
    pub max_instances: u32,
    pub warm_idle: Duration,
    /// Each plugin's own settings, by (tenant, plugin name).
    pub plugin_config: std::collections::HashMap<(String, String), std::collections::HashMap<String, String>>,
}

/// The longest total request deadline an endpoint may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// The shortest admin token accepted: a guessable admin token is every tenant's token.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 32;

/// Variables of the `herald` command-line client (`herald replay`), not configuration
/// keys: `serve` ignores them, so one shell can run both.
pub const CLIENT_VARS: [&str; 2] = ["HERALD_API", "HERALD_TOKEN"];

impl Config {
    /// Reads `path` (if any), applies `HERALD_*` variables from `env`, and validates.
    pub fn load(path: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let mut doc = match path {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.to_path_buf(), source })?;
                text.parse::<toml::Table>()
                    .map_err(|e| ConfigError::Parse { path: p.to_path_buf(), message: e.to_string() })?
            }
            None => toml::Table::new(),
        };
        apply_env(&mut doc, env)?;
        let raw: RawConfig = toml::Value::Table(doc).try_into().map_err(|e: toml::de::Error| ConfigError::Parse {
            path: path.map(Path::to_path_buf).unwrap_or_else(|| "<defaults>".into()),
            message: e.message().to_string(),
        })?;
        raw.validate()
    }
}

/// Applies `HERALD_<SECTION>_<KEY>` overrides. Known keys come from the defaults, so a
/// variable for a key that does not exist is an error, not silently ignored.
fn apply_env(doc: &mut toml::Table, env: impl IntoIterator<Item = (String, String)>) -> Result<(), ConfigError> {
    let defaults = toml::Table::try_from(RawConfig::default()).expect("defaults serialize");
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("HERALD_") else { continue };
        if CLIENT_VARS.contains(&name.as_str()) {
            continue;
        }
        let rest = rest.to_ascii_lowercase();
        let found = defaults.iter().find_map(|(section, keys)| {
            let key = rest.strip_prefix(section.as_str())?.strip_prefix('_')?;
            let default = keys.as_table()?.get(key)?;
            Some((section.clone(), key.to_string(), default.clone()))
        });
        let Some((section, key, default)) = found else {
            return Err(invalid(&name, "no such configuration key"));
        };
        let parsed = match default {
            toml::Value::String(_) => toml::Value::String(value),
            _ => format!("v = {value}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .ok_or_else(|| invalid(&name, format!("cannot parse {value:?}")))?,
        };
        let table = doc.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(table) = table.as_table_mut() else {
            return Err(invalid(&section, "must be a table"));
        };
        table.insert(key, parsed);
    }
    Ok(())
}

/// The longest duration any setting accepts (100 years). Every duration is stored and
/// added to timestamps as `i64` milliseconds; this bound keeps that arithmetic far from
/// overflow, so a huge value is refused instead of wrapping (e.g. to a few ms, or negative).
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Parses a duration written like `"250ms"`, `"30s"`, `"15m"`, `"24h"`, up to [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    if d > MAX_DURATION {
        return Err(format!("duration {text:?} is longer than the maximum of 100 years"));
    }
    Ok(d)
}

/// [`parse_duration`] in whole milliseconds (exact: the bound keeps it within `u64`).
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    parse_duration(text).map(|d| u64::try_from(d.as_millis()).expect("MAX_DURATION fits in u64 milliseconds"))
}

fn duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|reason| invalid(key, reason))
}

impl RawConfig {
    /// Checks every key and builds the typed `Config`.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let listen = self
            .server
            .listen
            .parse()
            .map_err(|e| invalid("server.listen", format!("{:?} is not host:port ({e})", self.server.listen)))?;
        if !(self.store.url.starts_with("sqlite:")
            || self.store.url.starts_with("postgres:")
            || self.store.url.starts_with("postgresql:"))
        {
            return Err(invalid("store.url", "must start with sqlite:// or postgres://"));
        }
        if crate::store::sqlite::is_in_memory(&self.store.url) {
            return Err(invalid("store.url", "an in-memory SQLite database is not durable; name a file"));
        }
        let delivery = DeliveryConfig {
            allow_private_destinations: self.delivery.allow_private_destinations,
            connect_timeout: duration("delivery.connect_timeout", &self.delivery.connect_timeout)?,
            timeout: duration("delivery.timeout", &self.delivery.timeout)?,
            lease_margin: duration("delivery.lease_margin", &self.delivery.lease_margin)?,
            disable_after: duration("delivery.disable_after", &self.delivery.disable_after)?,
            max_in_flight_total: self.delivery.max_in_flight_total as usize,
            secret_grace: duration("delivery.secret_grace", &self.delivery.secret_grace)?,
        };
        crate::model::check_timeouts(delivery.timeout, delivery.connect_timeout, MAX_TIMEOUT)
            .map_err(|e| invalid(&format!("delivery.{}", e.field), e.reason))?;
        if delivery.max_in_flight_total == 0 {
            return Err(invalid("delivery.max_in_flight_total", "must be at least 1"));
        }
        let jitter: Jitter = self.retry.jitter.parse().map_err(|e| invalid("retry.jitter", format!("{e}")))?;
        let retry = RetryPolicy::try_new(
            duration("retry.base", &self.retry.base)?,
            self.retry.factor,
            duration("retry.cap", &self.retry.cap)?,
            jitter,
            self.retry.max_attempts,
            duration("retry.ttl", &self.retry.ttl)?,
        )
        .map_err(|e| invalid("retry", e.to_string()))?;
        let d = &self.endpoint_defaults;
        crate::pace::Pacer::try_new(d.rate_per_sec, d.burst, d.max_in_flight)
            .map_err(|e| invalid("endpoint_defaults", e.to_string()))?;
        if self.intake.max_batch == 0 {
            return Err(invalid("intake.max_batch", "must be at least 1"));
        }
        if self.server.max_payload_bytes == 0 {
            return Err(invalid("server.max_payload_bytes", "must be at least 1"));
        }
        if self.plugins.max_plugins_per_tenant == 0 || self.plugins.max_tenant_bytes < self.plugins.max_plugin_bytes {
            return Err(invalid(
                "plugins.max_tenant_bytes",
                "a tenant must fit at least one plugin (max_plugins_per_tenant >= 1, max_tenant_bytes >= max_plugin_bytes)",
            ));
        }
        if self.plugins.cache_dir.is_empty() {
            return Err(invalid("plugins.cache_dir", "must name a directory (outside plugins.dir)"));
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid("log.format", "must be \"text\" or \"json\""));
        }
        let admin_token = self.server.admin_token()?;
        Ok(Config {
            listen,
            admin_token,
            max_payload_bytes: self.server.max_payload_bytes as usize,
            server: self.server.limits()?,
            store_url: StoreUrl::new(self.store.url),
            store_max_connections: self.store.max_connections.max(1),
            intake_max_batch: self.intake.max_batch as usize,
            max_events_per_request: self.intake.max_events_per_request.max(1) as usize,
            delivery,
            retry,
            endpoint_defaults: EndpointDefaults {
                rate_per_sec: d.rate_per_sec,
                burst: d.burst,
                max_in_flight: d.max_in_flight,
            },
            plugins: PluginsConfig {
                dir: PathBuf::from(self.plugins.dir),
                call_timeout: duration("plugins.call_timeout", &self.plugins.call_timeout)?,
                memory_limit_bytes: (self.plugins.memory_limit_mib as usize) << 20,
                max_plugin_bytes: self.plugins.max_plugin_bytes as usize,
                call_threads: self.plugins.call_threads as usize,
                max_plugins_per_tenant: self.plugins.max_plugins_per_tenant as usize,
                max_tenant_bytes: self.plugins.max_tenant_bytes as usize,
                structure: crate::plugin::StructureLimits {
                    max_function_bytes: self.plugins.max_function_bytes as usize,
                    max_functions: self.plugins.max_functions as usize,
                    max_modules: self.plugins.max_modules as usize,
                },
                cache_dir: PathBuf::from(&self.plugins.cache_dir),
                compiler_exe: None,
                compile_concurrency: self.plugins.compile_concurrency.max(1) as usize,
                compile_timeout: duration("plugins.compile_timeout", &self.plugins.compile_timeout)?,
                compile_memory_bytes: u64::from(self.plugins.compile_memory_mib) << 20,
                max_instances: match self.plugins.max_instances {
                    // Warm instances may take half the pool, so the other half must
                    // cover every call that can run at once (one per delivery in
                    // flight) and the loads and uploads beside them.
                    0 => (self.delivery.max_in_flight_total + self.plugins.compile_concurrency + 16).saturating_mul(2),
                    n => n,
                },
                warm_idle: duration("plugins.warm_idle", &self.plugins.warm_idle)?,
                plugin_config: self
                    .plugins
                    .config
                    .into_iter()
                    .flat_map(|(tenant, plugins)| {
                        plugins.into_iter().map(move |(name, kv)| ((tenant.clone(), name), kv.into_iter().collect()))
                    })
                    .collect(),
            },
            operator: self.operator.validate()?,
            retention: RetentionConfig {
                delivered: duration("retention.delivered", &self.retention.delivered)?,
                dead: duration("retention.dead", &self.retention.dead)?,
                every: duration("retention.every", &self.retention.every)?,
                batch: self.retention.batch.max(1),
            },
            log_level: self.log.level,
            log_json: self.log.format == "json",
        })
    }
}

impl RawServer {
    fn admin_token(&self) -> Result<Option<Redacted>, ConfigError> {
        let token = &self.admin_token;
        if token.is_empty() {
            return Ok(None);
        }
        if token.chars().count() < MIN_ADMIN_TOKEN_CHARS || token.trim() != token {
            return Err(invalid(
                "server.admin_token",
                format!("must be at least {MIN_ADMIN_TOKEN_CHARS} characters, without surrounding spaces"),
            ));
        }
        Ok(Some(Redacted::new(token.clone())))
    }

    fn limits(&self) -> Result<ServerLimits, ConfigError> {
        let limits = ServerLimits {
            header_read_timeout: duration("server.header_read_timeout", &self.header_read_timeout)?,
            idle_timeout: duration("server.idle_timeout", &self.idle_timeout)?,
            max_connections: self.max_connections as usize,
        };
        if limits.header_read_timeout.is_zero() {
            return Err(invalid("server.header_read_timeout", "must be positive"));
        }
        if limits.idle_timeout.is_zero() {
            return Err(invalid("server.idle_timeout", "must be positive"));
        }
        if limits.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be at least 1"));
        }
        Ok(limits)
    }
}

impl RawOperator {
    fn validate(self) -> Result<OperatorConfig, ConfigError> {
        let url = Some(self.url).filter(|u| !u.is_empty());
        if let Some(u) = &url {
            // The operator's own endpoint may be private: the operator chose it.
            crate::model::validate_url(u, true).map_err(|e| invalid("operator.url", e.reason))?;
            crate::sign::Secret::parse(&self.secret).map_err(|e| {
                invalid("operator.secret", format!("a whsec_ secret is required with operator.url: {e}"))
            })?;
        }
        Ok(OperatorConfig {
            url,
            secret: Redacted::new(self.secret),
            stale_after: duration("operator.stale_after", &self.stale_after)?,
            check_every: duration("operator.check_every", &self.check_every)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(&path, toml).unwrap();
        Config::load(Some(&path), env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn defaults_without_a_file() {
        let c = Config::load(None, Vec::new()).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(&*c.store_url, "sqlite://herald.db");
        assert_eq!(c.delivery.timeout, Duration::from_secs(10));
        assert_eq!(c.delivery.connect_timeout, Duration::from_secs(3));
        // The instance pool is sized from the limits: calls in flight, loads, and as
        // many warm instances again.
        assert_eq!(c.plugins.max_instances, 2 * (1024 + 1 + 16));
        assert!(c.admin_token.is_none());
        assert!(!c.delivery.allow_private_destinations);
    }

    #[test]
    fn env_overrides_file() {
        let c = load(
            "[server]\nlisten = \"127.0.0.1:1\"\n",
            &[
                ("HERALD_SERVER_LISTEN", "127.0.0.1:9000"),
                ("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "true"),
                ("HERALD_SERVER_ADMIN_TOKEN", LONG_TOKEN),
                ("PATH", "/bin"),
            ],
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
        assert!(c.delivery.allow_private_destinations);
        assert_eq!(c.admin_token.as_ref().map(Redacted::expose), Some(LONG_TOKEN));
    }

    const LONG_TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn client_variables_are_not_config_keys() {
        let c = load("", &[("HERALD_TOKEN", "hrld_x"), ("HERALD_API", "http://127.0.0.1:1")]).unwrap();
        assert!(c.admin_token.is_none());
    }

    #[test]
    fn debug_output_shows_no_secret() {
        let whsec = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0";
        let c = load(
            "",
            &[
                ("HERALD_SERVER_ADMIN_TOKEN", LONG_TOKEN),
                ("HERALD_OPERATOR_URL", "https://ops.example.com/hook"),
                ("HERALD_OPERATOR_SECRET", whsec),
                ("HERALD_STORE_URL", "postgres://herald:pg-pass-1@127.0.0.1/db?password=pg-pass-2"),
            ],
        )
        .unwrap();
        let printed = format!("{c:#?} {}", c.store_url);
        for secret in [LONG_TOKEN, whsec, "pg-pass-1", "pg-pass-2"] {
            assert!(!printed.contains(secret), "{secret} printed in {printed}");
        }
        assert!(printed.contains("postgres://herald:***@127.0.0.1/db"), "{printed}");
        assert_eq!(&*c.store_url, "postgres://herald:pg-pass-1@127.0.0.1/db?password=pg-pass-2");
    }

    /// TOML text, environment overrides, and the key the error must name.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

    #[test]
    fn errors_name_the_key() {
        let cases: &[Case<'_>] = &[
            ("[delivery]\ntimeout = \"ten\"\n", &[], "delivery.timeout"),
            ("[delivery]\ntimeout = \"60s\"\n", &[], "delivery.timeout"),
            ("[delivery]\ntimeout = \"18446744073709552s\"\n", &[], "delivery.timeout"),
            ("[retry]\nttl = \"10000000000000000s\"\n", &[], "retry.ttl"),
            ("[delivery]\nconnect_timeout = \"20s\"\n", &[], "delivery.connect_timeout"),
            ("[server]\nlisten = \"nowhere\"\n", &[], "server.listen"),
            ("[server]\nlisten_on = \"x\"\n", &[], "listen_on"),
            ("[retry]\njitter = \"sometimes\"\n", &[], "retry.jitter"),
            ("[store]\nurl = \"mysql://x\"\n", &[], "store.url"),
            ("[store]\nurl = \"sqlite::memory:\"\n", &[], "store.url"),
            ("", &[("HERALD_SERVER_NOPE", "1")], "HERALD_SERVER_NOPE"),
            ("", &[("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "maybe")], "HERALD_DELIVERY"),
            ("[server]\nadmin_token = \"short\"\n", &[], "server.admin_token"),
            ("", &[("HERALD_SERVER_ADMIN_TOKEN", &LONG_TOKEN[1..])], "server.admin_token"),
            ("[server]\nidle_timeout = \"0s\"\n", &[], "server.idle_timeout"),
            ("[server]\nheader_read_timeout = \"soon\"\n", &[], "server.header_read_timeout"),
            ("[server]\nmax_connections = 0\n", &[], "server.max_connections"),
            ("[plugins]\nmax_tenant_bytes = 1000\n", &[], "plugins.max_tenant_bytes"),
            ("[plugins]\ncompile_timeout = \"soon\"\n", &[], "plugins.compile_timeout"),
            ("[plugins]\nwarm_idle = \"idle\"\n", &[], "plugins.warm_idle"),
        ];
        for (toml, env, key) in cases {
            let err = load(toml, env).unwrap_err().to_string();
            assert!(err.contains(key), "{toml:?} {env:?}: {err}");
        }
    }

    #[test]
    fn example_file_is_valid_and_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/herald.example.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let from_file: toml::Table = text.parse().unwrap();
        let defaults = toml::Table::try_from(RawConfig::default()).unwrap();
        // Every key is documented, with its default value.
        for (section, keys) in &defaults {
            for (key, value) in keys.as_table().unwrap() {
                let documented = from_file.get(section).and_then(|s| s.get(key));
                assert_eq!(documented, Some(value), "{section}.{key}");
            }
        }
        Config::load(Some(&path), Vec::new()).unwrap();
    }
}
