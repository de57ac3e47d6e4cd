//! Configuration in two layers: `RawConfig` (TOML + `HERALD_<SECTION>_<KEY>` overrides, as
//! written) is validated into `Config` (typed, checked). This module never touches the
//! process environment itself: callers pass the variables in.

use crate::plugin::PluginConfig;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::schedule::{Jitter, RetryPolicy};
use crate::store::{StoreKind, StoreUrlError};

mod outbox;
mod plugins;
mod portal;
mod raw;
pub use outbox::{MAX_OUTBOX_BATCH, OutboxSource, RawOutbox, is_identifier};
pub use portal::PortalConfig;
pub use raw::*;

/// A configuration problem, naming the key and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config key `{key}`: {reason}")]
    Invalid { key: String, reason: String },
    /// A key's value came from a `HERALD_*` variable, and is wrong.
    #[error("{var} (config key `{key}`): {reason}")]
    Variable { var: String, key: String, reason: String },
    /// A value of the file that variables hide is wrong: it would be used once they are
    /// unset (`herald check-config` looks).
    #[error("{source} (in config file {path}, hidden by {vars})")]
    Hidden { path: PathBuf, vars: String, source: Box<ConfigError> },
}

/// The keys `HERALD_*` variables set: `(section.key, variable)`.
#[derive(Debug, Default)]
struct Vars(Vec<(String, String)>);

impl Vars {
    /// The variable that set `key`, or a key that holds it (`secrets.previous_keys[0]`), or
    /// (for a whole section's error) one of its keys.
    fn of(&self, key: &str) -> Option<&str> {
        let within = |outer: &str, inner: &str| inner.strip_prefix(outer).is_some_and(|r| r.starts_with(['.', '[']));
        let set = |k: &String| k == key || within(k, key) || within(key, k);
        self.0.iter().find(|(k, _)| set(k)).map(|(_, var)| var.as_str())
    }

    /// `e` naming the variable that set its key, if one did.
    fn blame(&self, e: ConfigError) -> ConfigError {
        match e {
            ConfigError::Invalid { key, reason } => match self.of(&key) {
                Some(var) => ConfigError::Variable { var: var.to_string(), key, reason },
                None => ConfigError::Invalid { key, reason },
            },
            e => e,
        }
    }
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), reason: reason.into() }
}

/// Most threads `server.worker_threads` may ask for.
const MAX_WORKER_THREADS: u32 = 256;

/// The validated configuration the rest of Herald reads. Its `Debug` (what
/// `herald check-config` prints) shows no secret: they are [`Redacted`] or [`StoreUrl`].
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// `server.admin_listen`: a listener of its own for `/healthz`, `/readyz` and
    /// `/metrics`, which a flood of the API's connections cannot starve.
    pub admin_listen: Option<SocketAddr>,
    /// `None`: admin routes refuse every request.
    pub admin_token: Option<Redacted>,
    pub max_payload_bytes: usize,
    pub server: ServerLimits,
    /// Threads of the node's async runtime (API, engine, HTTP); `None`: one per core.
    pub worker_threads: Option<usize>,
    pub store_url: StoreUrl,
    /// Which backend `store_url` names.
    pub store_kind: StoreKind,
    pub store_max_connections: u32,
    pub intake_max_batch: usize,
    pub max_events_per_request: usize,
    pub delivery: DeliveryConfig,
    pub retry: RetryPolicy,
    pub endpoint_defaults: EndpointDefaults,
    pub plugins: PluginConfig,
    pub operator: OperatorConfig,
    pub retention: RetentionConfig,
    /// `[[outbox]]`: producer outboxes this node relays.
    pub outbox: Vec<OutboxSource>,
    /// `cluster.node_id`: the name this node's leases are stored under; `None`: derived
    /// from the host name at start (`app::node_id`).
    pub node_id: Option<String>,
    pub log_level: String,
    pub log_json: bool,
    /// `[secrets]`: seals and opens stored secrets (`None`: no key configured, so no
    /// endpoint may store a TLS client key).
    pub secrets: Option<std::sync::Arc<crate::sign::seal::Sealer>>,
    /// `[tracing]`: where spans are exported (`None`: nowhere, and none are built).
    pub tracing: Option<TracingConfig>,
    /// `[portal]`: who may embed the customer portal, and what it may reach.
    pub portal: PortalConfig,
}

/// `[tracing]` with an `otlp_endpoint`: spans go there over OTLP/HTTP (protobuf).
#[derive(Debug, Clone)]
pub struct TracingConfig {
    /// The collector's traces URL (`/v1/traces` added to a URL with no path).
    pub otlp_endpoint: url::Url,
    /// The share of new traces recorded (0 to 1); a producer's sampled flag decides for
    /// the traces it starts.
    pub sample_ratio: f64,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

impl raw::RawTracing {
    fn validate(&self) -> Result<Option<TracingConfig>, ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(invalid("tracing.sample_ratio", "must be between 0 and 1"));
        }
        let text = self.otlp_endpoint.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let mut url = url::Url::parse(text).map_err(|e| invalid("tracing.otlp_endpoint", format!("{text:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(invalid("tracing.otlp_endpoint", "must be an http:// or https:// URL"));
        }
        if matches!(url.path(), "" | "/") {
            url.set_path("/v1/traces");
        }
        let service_name = match self.service_name.trim() {
            "" => return Err(invalid("tracing.service_name", "must not be empty")),
            name => name.to_string(),
        };
        Ok(Some(TracingConfig { otlp_endpoint: url, sample_ratio: self.sample_ratio, service_name }))
    }
}

/// How the API listener treats connections: every one must send its request head within
/// `header_read_timeout`, a request body may not pause for `body_read_timeout` (`408`), an
/// idle keep-alive connection is closed after `idle_timeout`, and at most `max_connections`
/// are served at once (the rest wait in the kernel's backlog).
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
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
    /// The node's egress proxy (its `Debug` hides the password).
    pub proxy: Option<std::sync::Arc<crate::net::proxy::ProxyUrl>>,
    pub no_proxy: std::sync::Arc<crate::net::proxy::NoProxy>,
}

#[derive(Debug, Clone, Copy)]
pub struct EndpointDefaults {
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
}

/// The longest total request deadline an endpoint may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// The shortest admin token accepted: a guessable admin token is every tenant's token.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 32;

/// Variables of the `herald` command-line client (`herald replay`, `herald trigger`), not
/// configuration keys: `serve` ignores them, so one shell can run both.
pub const CLIENT_VARS: [&str; 3] = ["HERALD_API", "HERALD_TOKEN", "HERALD_TENANT"];

impl Config {
    /// Reads `path` (if any), applies `HERALD_*` variables from `env`, and validates. An
    /// error names the key at fault, and the variable when one set it.
    pub fn load(path: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let (raw, vars) = RawConfig::read(path, env)?;
        raw.validate().map_err(|e| vars.blame(e))
    }
}

impl RawConfig {
    /// Reads `path` (if any) and applies `HERALD_*` variables from `env`: every key, with
    /// its default where neither sets it; not validated (see [`RawConfig::validate`]).
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<RawConfig, ConfigError> {
        Self::read(path, env).map(|(raw, _)| raw)
    }

    /// What `herald check-config` checks: what [`Config::load`] does, and also the file's
    /// own values that variables hide (a wrong one would be used once they are unset).
    /// Returns the configuration as loaded.
    pub fn check(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<RawConfig, ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let (raw, vars) = Self::read(path, env.clone())?;
        raw.clone().validate().map_err(|e| vars.blame(e))?;
        let Some(path) = path else { return Ok(raw) };
        let file = read_file(path)?;
        let in_file = |key: &str| {
            let (section, key) = key.split_once('.').unwrap_or((key, ""));
            file.get(section).and_then(toml::Value::as_table).is_some_and(|t| t.contains_key(key))
        };
        let hidden: Vec<&str> = vars.0.iter().filter(|(key, _)| in_file(key)).map(|(_, var)| var.as_str()).collect();
        if hidden.is_empty() {
            return Ok(raw);
        }
        let rest = env.into_iter().filter(|(name, _)| !hidden.contains(&name.as_str()));
        Self::read(Some(path), rest)
            .and_then(|(file_raw, vars)| file_raw.validate().map_err(|e| vars.blame(e)))
            .map_err(|source| ConfigError::Hidden {
                path: path.to_path_buf(),
                vars: hidden.join(", "),
                source: Box::new(source),
            })?;
        Ok(raw)
    }

    /// [`RawConfig::load`], and which keys the variables set. A value of the wrong type is
    /// named by its key, and by its variable when one set it.
    fn read(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(RawConfig, Vars), ConfigError> {
        let mut doc = match path {
            Some(p) => read_file(p)?,
            None => toml::Table::new(),
        };
        let vars = apply_env(&mut doc, env)?;
        let raw: RawConfig = serde_path_to_error::deserialize(toml::Value::Table(doc)).map_err(
            |e: serde_path_to_error::Error<toml::de::Error>| {
                let (key, reason) = (e.path().to_string(), e.inner().message().to_string());
                match vars.of(&key) {
                    Some(var) => ConfigError::Variable { var: var.to_string(), key, reason },
                    None => ConfigError::Parse {
                        path: path.map(Path::to_path_buf).unwrap_or_else(|| "<defaults>".into()),
                        message: format!("{key}: {reason}"),
                    },
                }
            },
        )?;
        Ok((raw, vars))
    }

    /// Every key with its value, one `section.key = value` line each in TOML's notation
    /// (what `herald check-config` prints), secrets shown as `"<redacted>"`: the admin
    /// token, the operator secret, the values of `[plugins.config]` and
    /// `[plugins.override]` (their keys, yes) and the password of any URL.
    pub fn effective_keys(&self) -> String {
        let doc = toml::Value::try_from(self).unwrap_or_else(|_| toml::Value::Table(Default::default()));
        let mut lines = Vec::new();
        key_lines(&doc, "", &mut lines);
        lines.join("\n")
    }
}

/// Whether the value at `path` is a secret `effective_keys` never prints.
fn is_secret(path: &str) -> bool {
    matches!(path, "server.admin_token" | "operator.secret" | "delivery.proxy" | "secrets.key")
        || path.starts_with("plugins.config.")
        || path.starts_with("plugins.override.")
}

/// Appends a `path = value` line for each leaf under `value`.
fn key_lines(value: &toml::Value, path: &str, lines: &mut Vec<String>) {
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        toml::Value::Table(table) => table.iter().for_each(|(k, v)| key_lines(v, &join(k), lines)),
        toml::Value::Array(items) if items.iter().any(toml::Value::is_table) => {
            items.iter().enumerate().for_each(|(i, v)| key_lines(v, &format!("{path}[{i}]"), lines))
        }
        toml::Value::String(s) if is_secret(path) && !s.is_empty() => lines.push(format!("{path} = \"<redacted>\"")),
        toml::Value::Array(items) if path == "secrets.previous_keys" => {
            lines.push(format!("{path} = <{} redacted>", items.len()))
        }
        toml::Value::String(s) if path.ends_with("url") => {
            lines.push(format!("{path} = {}", toml::Value::String(StoreUrl::new(s.as_str()).redacted())))
        }
        leaf => lines.push(format!("{path} = {leaf}")),
    }
}

/// The TOML table of the file at `path`.
fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })
}

/// Applies `HERALD_<SECTION>_<KEY>` overrides, and says which keys they set. Known keys
/// come from the defaults, so a variable for a key that does not exist is an error, not
/// silently ignored.
fn apply_env(doc: &mut toml::Table, env: impl IntoIterator<Item = (String, String)>) -> Result<Vars, ConfigError> {
    let mut vars = Vars::default();
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
        let parsed =
            match default {
                toml::Value::String(_) => toml::Value::String(value),
                _ => format!("v = {value}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).ok_or_else(
                    || ConfigError::Variable {
                        var: name.clone(),
                        key: format!("{section}.{key}"),
                        reason: format!("cannot parse {value:?} as a TOML value"),
                    },
                )?,
            };
        let table = doc.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(table) = table.as_table_mut() else {
            return Err(invalid(&section, "must be a table"));
        };
        vars.0.push((format!("{section}.{key}"), name));
        table.insert(key, parsed);
    }
    Ok(vars)
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

/// What `herald plugin check` and `plugin run` load with: [`PluginConfig::for_cli`], with
/// the two variables that set `plugins.js_runtime` and `plugins.call_timeout` for `herald
/// serve` (a slower machine can check with the budget its server will give).
pub fn plugin_cli_config() -> Result<PluginConfig, String> {
    let mut config = PluginConfig::for_cli();
    config.js_runtime = std::env::var_os("HERALD_PLUGINS_JS_RUNTIME").map(Into::into);
    if let Ok(text) = std::env::var("HERALD_PLUGINS_CALL_TIMEOUT") {
        config.call_timeout = parse_duration(&text).map_err(|e| format!("HERALD_PLUGINS_CALL_TIMEOUT: {e}"))?;
    }
    Ok(config)
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
        let listen = address("server.listen", &self.server.listen)?;
        let (store_url, store_kind) = self.store.url()?;
        let delivery = self.delivery.validate()?;
        let retry = self.retry.validate()?;
        let endpoint_defaults = self.endpoint_defaults.validate()?;
        if self.intake.max_batch == 0 {
            return Err(invalid("intake.max_batch", "must be at least 1"));
        }
        if self.server.max_payload_bytes == 0 {
            return Err(invalid("server.max_payload_bytes", "must be at least 1"));
        }
        let data_dir = plugins::data_dir(&self.store.url);
        let plugins = self.plugins.validate(self.delivery.max_in_flight_total, &data_dir)?;
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid("log.format", "must be \"text\" or \"json\""));
        }
        let admin_listen = match self.server.admin_listen.as_str() {
            "" => None,
            text => Some(address("server.admin_listen", text)?),
        };
        Ok(Config {
            listen,
            admin_listen,
            admin_token: self.server.admin_token()?,
            max_payload_bytes: self.server.max_payload_bytes as usize,
            server: self.server.limits()?,
            worker_threads: self.server.worker_threads()?,
            store_url,
            store_kind,
            store_max_connections: self.store.max_connections.max(1),
            intake_max_batch: self.intake.max_batch as usize,
            max_events_per_request: self.intake.max_events_per_request.max(1) as usize,
            delivery,
            retry,
            endpoint_defaults,
            plugins,
            operator: self.operator.validate()?,
            retention: self.retention.validate()?,
            outbox: outbox::validate(&self.outbox)?,
            node_id: node_id(&self.cluster.node_id)?,
            secrets: self.secrets.sealer()?,
            log_level: self.log.level,
            log_json: self.log.format == "json",
            tracing: self.tracing.validate()?,
            portal: self.portal.validate()?,
        })
    }
}

/// `key`'s socket address, written `host:port`.
fn address(key: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|e| invalid(key, format!("{text:?} is not host:port ({e})")))
}

impl RawSecrets {
    /// `[secrets]`: the sealer of its keys, or none when no key is set.
    fn sealer(&self) -> Result<Option<std::sync::Arc<crate::sign::seal::Sealer>>, ConfigError> {
        let sealer = match self.key.trim() {
            "" if self.previous_keys.is_empty() => return Ok(None),
            "" => return Err(invalid("secrets.key", "is required when previous_keys are set")),
            key => crate::sign::seal::Sealer::new(key, &self.previous_keys).map_err(|(i, e)| match i {
                0 => invalid("secrets.key", e),
                n => invalid(&format!("secrets.previous_keys[{}]", n - 1), e),
            })?,
        };
        Ok(Some(std::sync::Arc::new(sealer)))
    }
}

/// Longest `cluster.node_id` (it is stored with every lease).
pub const MAX_NODE_ID: usize = 64;

/// `cluster.node_id`: empty for the default, else letters, digits, `.`, `_` and `-`.
fn node_id(text: &str) -> Result<Option<String>, ConfigError> {
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() > MAX_NODE_ID || !text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return Err(invalid("cluster.node_id", format!("up to {MAX_NODE_ID} letters, digits, '.', '_' or '-'")));
    }
    Ok(Some(text.to_string()))
}

impl RawStore {
    fn url(&self) -> Result<(StoreUrl, StoreKind), ConfigError> {
        match StoreKind::parse(&self.url) {
            Ok(kind) => Ok((StoreUrl::new(self.url.clone()), kind)),
            Err(StoreUrlError::Scheme(_)) => Err(invalid("store.url", "must start with sqlite:// or postgres://")),
            Err(e @ StoreUrlError::InMemory) => Err(invalid("store.url", e.to_string())),
        }
    }
}

impl RawDelivery {
    fn validate(&self) -> Result<DeliveryConfig, ConfigError> {
        let delivery = DeliveryConfig {
            allow_private_destinations: self.allow_private_destinations,
            connect_timeout: duration("delivery.connect_timeout", &self.connect_timeout)?,
            timeout: duration("delivery.timeout", &self.timeout)?,
            lease_margin: duration("delivery.lease_margin", &self.lease_margin)?,
            disable_after: duration("delivery.disable_after", &self.disable_after)?,
            max_in_flight_total: self.max_in_flight_total as usize,
            secret_grace: duration("delivery.secret_grace", &self.secret_grace)?,
            proxy: match self.proxy.trim() {
                "" => None,
                p => Some(crate::net::proxy::ProxyUrl::parse(p).map_err(|e| invalid("delivery.proxy", e))?.into()),
            },
            no_proxy: crate::net::proxy::NoProxy::parse(&self.no_proxy)
                .map_err(|e| invalid("delivery.no_proxy", e))?
                .into(),
        };
        crate::spec::check_timeouts(delivery.timeout, delivery.connect_timeout, MAX_TIMEOUT)
            .map_err(|e| invalid(&format!("delivery.{}", e.field), e.reason))?;
        if delivery.max_in_flight_total == 0 {
            return Err(invalid("delivery.max_in_flight_total", "must be at least 1"));
        }
        Ok(delivery)
    }
}

impl RawRetry {
    fn validate(&self) -> Result<RetryPolicy, ConfigError> {
        let jitter: Jitter = self.jitter.parse().map_err(|e| invalid("retry.jitter", format!("{e}")))?;
        RetryPolicy::try_new(
            duration("retry.base", &self.base)?,
            self.factor,
            duration("retry.cap", &self.cap)?,
            jitter,
            self.max_attempts,
            duration("retry.ttl", &self.ttl)?,
        )
        .map_err(|e| invalid(&format!("retry.{}", e.field()), e.to_string()))
    }
}

impl RawEndpointDefaults {
    fn validate(&self) -> Result<EndpointDefaults, ConfigError> {
        crate::pace::Pacer::try_new(self.rate_per_sec, self.burst, self.max_in_flight)
            .map_err(|e| invalid(&format!("endpoint_defaults.{}", e.field()), e.to_string()))?;
        Ok(EndpointDefaults { rate_per_sec: self.rate_per_sec, burst: self.burst, max_in_flight: self.max_in_flight })
    }
}

impl RawRetention {
    fn validate(&self) -> Result<RetentionConfig, ConfigError> {
        Ok(RetentionConfig {
            delivered: duration("retention.delivered", &self.delivered)?,
            dead: duration("retention.dead", &self.dead)?,
            every: duration("retention.every", &self.every)?,
            batch: self.batch.max(1),
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
            body_read_timeout: duration("server.body_read_timeout", &self.body_read_timeout)?,
            idle_timeout: duration("server.idle_timeout", &self.idle_timeout)?,
            max_connections: self.max_connections as usize,
        };
        if limits.header_read_timeout.is_zero() {
            return Err(invalid("server.header_read_timeout", "must be positive"));
        }
        if limits.body_read_timeout.is_zero() {
            return Err(invalid("server.body_read_timeout", "must be positive"));
        }
        if limits.idle_timeout.is_zero() {
            return Err(invalid("server.idle_timeout", "must be positive"));
        }
        if limits.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be at least 1"));
        }
        Ok(limits)
    }

    /// The async runtime's thread count; `None` (0 in the file): one per core.
    fn worker_threads(&self) -> Result<Option<usize>, ConfigError> {
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(invalid(
                "server.worker_threads",
                format!("must be at most {MAX_WORKER_THREADS} (0: one per core)"),
            ));
        }
        Ok(Some(self.worker_threads as usize).filter(|n| *n > 0))
    }
}

impl RawOperator {
    fn validate(self) -> Result<OperatorConfig, ConfigError> {
        let url = Some(self.url).filter(|u| !u.is_empty());
        if let Some(u) = &url {
            // The operator's own endpoint may be private: the operator chose it.
            crate::spec::validate_url(u, true).map_err(|e| invalid("operator.url", e.reason))?;
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
mod tests;
