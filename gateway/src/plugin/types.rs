//! The plugin host's vocabulary: settings, hooks, what a loaded plugin looks like from
//! outside, and the two error types (a plugin call that failed vs. a management
//! operation that failed). No wasmtime here.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Settings the operator wrote for plugins, keyed by (tenant, plugin name): key → value.
/// Its `Debug` (what `herald check-config` prints) shows the keys, not the values: a value
/// may be a plugin's own secret (an API key, a signing key).
#[derive(Clone, Default)]
pub struct PluginValues(pub HashMap<(String, String), HashMap<String, String>>);

impl std::ops::Deref for PluginValues {
    type Target = HashMap<(String, String), HashMap<String, String>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for PluginValues {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl std::fmt::Debug for PluginValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: std::collections::BTreeMap<String, std::collections::BTreeMap<&str, &str>> = self
            .0
            .iter()
            .map(|((tenant, plugin), kv)| {
                (format!("{tenant}.{plugin}"), kv.keys().map(|k| (k.as_str(), "<redacted>")).collect())
            })
            .collect();
        shown.fmt(f)
    }
}

/// Settings of the plugin host (from the `[plugins]` TOML section).
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// Plugins live in `<dir>/<tenant>/<name>.wasm`. Created when missing.
    pub dir: PathBuf,
    /// Time budget of one hook call, as CPU time of the call's thread (so that a
    /// preempted call is not blamed), with a measurement tolerance: a call is stopped once
    /// it has used 1.25x its budget of CPU time (`sandbox::BUDGET_TOLERANCE`), plus at most
    /// one 1 ms tick; a starved one after 1000x of wall time. Default 10 ms.
    pub call_timeout: Duration,
    /// Extra time budget per MiB of a call's input (the request body of `transform` and
    /// `sign`), so a large event can go through a transform. Default 100 ms.
    pub call_timeout_per_mib: Duration,
    /// Linear memory cap of one plugin instance, in bytes. Default 16 MiB.
    pub memory_limit: usize,
    /// Cap on what one call may return (body + header bytes + strings). Default 4 MiB.
    pub max_output_bytes: usize,
    /// Cap on the size of a `.wasm` file. Default 8 MiB.
    pub max_plugin_bytes: usize,
    /// Plugins one tenant may upload. Default 20.
    pub max_plugins_per_tenant: usize,
    /// Total bytes of one tenant's uploaded plugins. Default 32 MiB.
    pub max_tenant_bytes: usize,
    /// Structural limits checked before anything is compiled.
    pub structure: StructureLimits,
    /// Compiled artifacts are cached here, keyed by the component's SHA-256 and the
    /// engine's configuration. `None`: compile in memory every time (the CLI).
    /// Must be a directory only Herald writes: artifacts are loaded as trusted code.
    pub cache_dir: Option<PathBuf>,
    /// The `herald` binary to compile in (`herald plugin compile`, a child process
    /// with a memory limit and a timeout). `None`: compile in this process.
    pub compiler_exe: Option<PathBuf>,
    /// Compiles running at once, uploads and background loads together. Default 1.
    pub compile_concurrency: usize,
    /// Wall-clock limit of one compile in the child process. Default 20 s.
    pub compile_timeout: Duration,
    /// Data (heap) limit of the compiling child process, in bytes. Default 512 MiB.
    pub compile_memory: u64,
    /// Most plugin instances alive at once across all plugins (pooling allocator
    /// slots: calls in flight plus warm instances, which may take at most half).
    /// Default 1000.
    pub max_instances: u32,
    /// Threads that run hook calls (the call pool), off the async runtime; tenants take
    /// turns on them and no tenant holds them all. 0 (the default): one per CPU, at
    /// least 2.
    pub call_threads: usize,
    /// Warm instances kept per loaded plugin version for reuse. Default 4.
    pub warm_instances_per_plugin: usize,
    /// A warm instance unused for this long is dropped, freeing its slot. Default 30 s.
    pub warm_idle: Duration,
    /// How long the file watcher waits for a file to stop changing. Default 200 ms.
    pub reload_debounce: Duration,
    /// Watch `dir` and hot-reload changed plugins. Default true.
    pub watch: bool,
    /// Herald's JavaScript runtime component (`scripts/build-js-runtime` builds
    /// `target/js-runtime/herald-js.wasm`), which runs every tenant's `.js` plugin.
    /// `None`: looked for beside the running executable, in `js-runtime/` of the target
    /// directory it was built in, then in `target/js-runtime/` of the working directory;
    /// JavaScript uploads are refused when there is none.
    pub js_runtime: Option<PathBuf>,
    /// Linear memory cap of one JavaScript plugin instance (the runtime's own heap
    /// included), in bytes. Default 64 MiB.
    pub js_memory_limit: usize,
    /// Each plugin's own configuration, keyed by (tenant, plugin name); the plugin reads
    /// it with `get-config`. The operator's defaults: a tenant's own settings (see
    /// [`PluginHost::set_tenant_config`](super::PluginHost::set_tenant_config)) replace
    /// these key by key.
    pub plugin_config: PluginValues,
    /// The operator's overrides, keyed like `plugin_config`: these keys win over a
    /// tenant's own settings.
    pub plugin_overrides: PluginValues,
    /// `[plugins.tenant.<tenant>]`: limits the operator sets for one tenant (a JavaScript
    /// tenant may need more memory, a trusted one a larger plugin). Unset ones follow the
    /// values above; [`PluginConfig::limits`] resolves them.
    pub tenant_limits: HashMap<String, TenantLimitOverrides>,
}

/// One tenant's own limits, as the operator wrote them: `None` follows the global value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantLimitOverrides {
    /// Replaces [`PluginConfig::call_timeout`].
    pub call_timeout: Option<Duration>,
    /// Replaces [`PluginConfig::call_timeout_per_mib`].
    pub call_timeout_per_mib: Option<Duration>,
    /// Replaces [`PluginConfig::memory_limit`], in bytes.
    pub memory_limit: Option<usize>,
    /// Replaces [`PluginConfig::js_memory_limit`], in bytes.
    pub js_memory_limit: Option<usize>,
    /// Replaces [`PluginConfig::max_plugin_bytes`].
    pub max_plugin_bytes: Option<usize>,
    /// Replaces [`PluginConfig::max_plugins_per_tenant`].
    pub max_plugins: Option<usize>,
    /// Replaces [`PluginConfig::max_tenant_bytes`].
    pub max_tenant_bytes: Option<usize>,
}

/// The limits that hold for one tenant: its overrides over the global values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    /// CPU budget of one call before the input-size part.
    pub call_timeout: Duration,
    /// Extra budget per MiB of a call's input.
    pub call_timeout_per_mib: Duration,
    /// Linear memory cap of one component instance, in bytes.
    pub memory_limit: usize,
    /// Linear memory cap of one JavaScript instance, in bytes.
    pub js_memory_limit: usize,
    /// Largest plugin upload, in bytes.
    pub max_plugin_bytes: usize,
    /// Most plugins.
    pub max_plugins: usize,
    /// Most bytes stored: serving files and kept versions (see `PluginHost::install`).
    pub max_tenant_bytes: usize,
}

impl PluginConfig {
    /// The server's defaults for one file checked or run from the command line: no
    /// directory watched, a few instances.
    pub fn for_cli() -> Self {
        PluginConfig { max_instances: 4, watch: false, ..PluginConfig::new(".") }
    }

    /// The defaults, with plugins under `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PluginConfig {
            dir: dir.into(),
            call_timeout: Duration::from_millis(10),
            call_timeout_per_mib: Duration::from_millis(100),
            memory_limit: 16 << 20,
            max_output_bytes: 4 << 20,
            max_plugin_bytes: 8 << 20,
            max_plugins_per_tenant: 20,
            max_tenant_bytes: 32 << 20,
            structure: StructureLimits::default(),
            cache_dir: None,
            compiler_exe: None,
            compile_concurrency: 1,
            compile_timeout: Duration::from_secs(20),
            compile_memory: 512 << 20,
            max_instances: 1000,
            call_threads: 0,
            warm_instances_per_plugin: 4,
            warm_idle: Duration::from_secs(30),
            reload_debounce: Duration::from_millis(200),
            watch: true,
            js_runtime: None,
            js_memory_limit: 64 << 20,
            plugin_config: PluginValues::default(),
            plugin_overrides: PluginValues::default(),
            tenant_limits: HashMap::new(),
        }
    }
}

impl PluginConfig {
    /// The limits of `tenant`: its `[plugins.tenant.<tenant>]` values, else the globals.
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        let o = self.tenant_limits.get(tenant).cloned().unwrap_or_default();
        TenantLimits {
            call_timeout: o.call_timeout.unwrap_or(self.call_timeout),
            call_timeout_per_mib: o.call_timeout_per_mib.unwrap_or(self.call_timeout_per_mib),
            memory_limit: o.memory_limit.unwrap_or(self.memory_limit),
            js_memory_limit: o.js_memory_limit.unwrap_or(self.js_memory_limit),
            max_plugin_bytes: o.max_plugin_bytes.unwrap_or(self.max_plugin_bytes),
            max_plugins: o.max_plugins.unwrap_or(self.max_plugins_per_tenant),
            max_tenant_bytes: o.max_tenant_bytes.unwrap_or(self.max_tenant_bytes),
        }
    }

    /// The config key that sets `tenant`'s limit `field` (a [`TenantLimitOverrides`]
    /// field name): the tenant's own key when it sets one, else the global key. Limit
    /// errors name it, so the operator knows which value to change.
    pub fn limit_key(&self, tenant: &str, field: &str) -> String {
        let o = self.tenant_limits.get(tenant);
        let own = o.is_some_and(|o| match field {
            "call_timeout" => o.call_timeout.is_some(),
            "call_timeout_per_mib" => o.call_timeout_per_mib.is_some(),
            "memory_limit" => o.memory_limit.is_some(),
            "js_memory_limit" => o.js_memory_limit.is_some(),
            "max_plugin_bytes" => o.max_plugin_bytes.is_some(),
            "max_plugins" => o.max_plugins.is_some(),
            "max_tenant_bytes" => o.max_tenant_bytes.is_some(),
            _ => false,
        });
        let key = match field {
            "memory_limit" | "js_memory_limit" => format!("{field}_mib"),
            "max_plugins" if !own => "max_plugins_per_tenant".to_string(),
            _ => field.to_string(),
        };
        if own { format!("plugins.tenant.{tenant}.{key}") } else { format!("plugins.{key}") }
    }

    /// The largest linear memory any instance may have, over every tenant (the instance
    /// pool reserves for it).
    pub fn max_memory(&self) -> usize {
        let own = self.tenant_limits.values().flat_map(|o| [o.memory_limit, o.js_memory_limit]).flatten();
        own.fold(self.memory_limit.max(self.js_memory_limit), usize::max)
    }

    /// The call pool's size: `call_threads`, or one per CPU (at least 2) when 0.
    pub fn call_threads(&self) -> usize {
        match self.call_threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()).max(2),
            n => n,
        }
    }
}

/// Cheap structural limits on a component, checked by parsing (not compiling) it, so
/// that a compile bomb is refused for the price of reading its bytes. Compile time
/// and memory grow with the size of single functions far more than with their sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StructureLimits {
    /// Largest function body, in bytes. Default 512 KiB (the example plugins' largest
    /// is under 40 KiB).
    pub max_function_bytes: usize,
    /// Most functions, over all core modules. Default 20 000.
    pub max_functions: usize,
    /// Most core modules in the component, nested ones included. Default 16.
    pub max_modules: usize,
}

impl Default for StructureLimits {
    fn default() -> Self {
        StructureLimits { max_function_bytes: 512 << 10, max_functions: 20_000, max_modules: 16 }
    }
}

/// One of the three hooks of the `herald:plugin` world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `transform(ctx, request) -> result<send | drop, error>`.
    Transform,
    /// `classify(ctx, outcome) -> verdict`.
    Classify,
    /// `sign(ctx, secrets, request) -> result<list<header>, error>`.
    Sign,
}

impl Hook {
    /// Every hook, in WIT order.
    pub const ALL: [Hook; 3] = [Hook::Transform, Hook::Classify, Hook::Sign];

    /// The hook's WIT name.
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Transform => "transform",
            Hook::Classify => "classify",
            Hook::Sign => "sign",
        }
    }

    /// Parses a WIT hook name.
    pub fn parse(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.as_str() == name)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The set of hooks a plugin declares (through its `describe` export).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookSet {
    /// Declares `transform`.
    pub transform: bool,
    /// Declares `classify`.
    pub classify: bool,
    /// Declares `sign`.
    pub sign: bool,
}

impl HookSet {
    /// Whether `hook` is in the set.
    pub fn contains(self, hook: Hook) -> bool {
        match hook {
            Hook::Transform => self.transform,
            Hook::Classify => self.classify,
            Hook::Sign => self.sign,
        }
    }

    /// The hooks in the set, in WIT order.
    pub fn iter(self) -> impl Iterator<Item = Hook> {
        Hook::ALL.into_iter().filter(move |h| self.contains(*h))
    }

    /// Whether no hook is declared.
    pub fn is_empty(self) -> bool {
        self.iter().next().is_none()
    }
}

impl std::fmt::Display for HookSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.iter().map(Hook::as_str).collect();
        f.write_str(&names.join(","))
    }
}

/// A plugin file as the registry sees it: the version serving calls, if any, and the
/// last load error, if the newest file failed to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginInfo {
    /// The tenant the plugin belongs to.
    pub tenant: String,
    /// The plugin's name (its file name without `.wasm`).
    pub name: String,
    /// Hooks of the serving version (empty when none is serving).
    pub hooks: HookSet,
    /// Hex SHA-256 of the serving version's bytes (empty when none is serving).
    pub sha256: String,
    /// Size of the serving version in bytes.
    pub size: u64,
    /// What the serving version's `describe` says its name and version are.
    pub plugin_name: String,
    /// See `plugin_name`.
    pub plugin_version: String,
    /// The response statuses the serving version's `classify` is called for; `None`:
    /// every outcome.
    pub classify_statuses: Option<Vec<u16>>,
    /// When the serving version was loaded.
    pub loaded_at: Option<SystemTime>,
    /// How long loading the serving version took (compiling or mapping it, instantiating
    /// it, `describe`): paid once by the upload or reload, not by its first call.
    pub load_time: Option<Duration>,
    /// The file is being loaded in the background (after a start or a file change);
    /// deliveries bound to it wait until it serves.
    pub loading: bool,
    /// Why the newest file on disk is not serving, when it failed to load. The previous
    /// version, if any, keeps serving.
    pub error: Option<String>,
    /// The number of the stored version that serves, if the serving bytes are one.
    pub version: Option<u32>,
}

/// Call and failure counters of one plugin hook, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginMetrics {
    /// The plugin's tenant.
    pub tenant: String,
    /// The plugin's name.
    pub name: String,
    /// The hook.
    pub hook: Hook,
    /// Calls started (a `classify` answered by the plugin's declared status filter,
    /// without entering it, counts too).
    pub calls: u64,
    /// Calls that failed (any [`PluginFailure`]).
    pub failures: u64,
}

/// Why a hook call produced no usable result. Its `Display` is the short,
/// machine-readable reason that the gateway records as `plugin:<reason>`.
///
/// [`PluginFailure::Guest`] is the plugin saying "no" (its hook returned an `error`);
/// every other variant is Herald containing a broken or hostile plugin.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PluginFailure {
    /// No plugin of that name is loaded for the tenant.
    #[error("not_found")]
    NotFound,
    /// The plugin does not declare that hook.
    #[error("hook_not_implemented")]
    HookNotImplemented,
    /// The call exceeded its time budget (epoch deadline); the detail names the budget
    /// and the key that sets it (empty where the budget is unknown).
    #[error("timeout{}", detail(.0))]
    Timeout(String),
    /// The instance tried to grow its memory past the cap; the detail names the cap and
    /// its key.
    #[error("memory{}", detail(.0))]
    Memory(String),
    /// The guest trapped (`unreachable`, out-of-bounds access, stack overflow, …).
    #[error("trap: {0}")]
    Trap(String),
    /// The call returned more than `max_output_bytes`.
    #[error("output_too_large")]
    OutputTooLarge,
    /// The call returned something Herald cannot use (bad header, bad encoding, …).
    #[error("invalid_output: {0}")]
    InvalidOutput(String),
    /// The hook returned its `error` case.
    #[error("error: {0}")]
    Guest(String),
    /// No instance could be created (the instance pool is exhausted).
    #[error("busy")]
    Busy,
}

impl PluginFailure {
    /// The variant's short name, e.g. `timeout` or `trap` (no detail): a metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginFailure::NotFound => "not_found",
            PluginFailure::HookNotImplemented => "hook_not_implemented",
            PluginFailure::Timeout(_) => "timeout",
            PluginFailure::Memory(_) => "memory",
            PluginFailure::Trap(_) => "trap",
            PluginFailure::OutputTooLarge => "output_too_large",
            PluginFailure::InvalidOutput(_) => "invalid_output",
            PluginFailure::Guest(_) => "error",
            PluginFailure::Busy => "busy",
        }
    }

    /// `plugin:<reason>`, as recorded on the attempt and the dead letter.
    pub fn reason(&self) -> String {
        format!("plugin:{self}")
    }

    pub(crate) const KINDS: [&'static str; 9] = [
        "not_found",
        "hook_not_implemented",
        "timeout",
        "memory",
        "trap",
        "output_too_large",
        "invalid_output",
        "error",
        "busy",
    ];

    pub(crate) fn kind_index(&self) -> usize {
        Self::KINDS.iter().position(|k| *k == self.kind()).unwrap_or(0)
    }
}

/// `: <detail>` after a failure's kind, or nothing.
fn detail(detail: &str) -> String {
    if detail.is_empty() { String::new() } else { format!(": {detail}") }
}

/// Why a management operation (load, install, check, run) failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A tenant or plugin name that is not a slug.
    #[error("invalid {what} {value:?}: expected 1-64 characters of [a-z0-9_-]")]
    InvalidName {
        /// `tenant` or `plugin name`.
        what: &'static str,
        /// The rejected value.
        value: String,
    },
    /// The file is larger than the tenant's `max_plugin_bytes`.
    #[error("plugin is {size} bytes; {key} is {limit}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
        /// The config key of the limit (the tenant's own or the global one).
        key: String,
    },
    /// The tenant would pass one of its plugin limits.
    #[error("tenant {tenant} would have {have} {what}; {key} is {limit}")]
    TenantLimit {
        /// The tenant.
        tenant: String,
        /// `plugins`, or what counts toward the byte limit.
        what: &'static str,
        /// The config key of the limit, e.g. `plugins.max_tenant_bytes` or
        /// `plugins.tenant.acme.max_plugins`.
        key: String,
        /// What the tenant would have.
        have: usize,
        /// The limit.
        limit: usize,
    },
    /// The bytes are not a WebAssembly component Herald can compile.
    #[error("not a valid WebAssembly component: {0}")]
    Invalid(String),
    /// The component is valid but over a structural limit, checked before compiling.
    #[error("component refused before compiling: {0}")]
    Structure(String),
    /// Compiling took longer or needed more memory than allowed.
    #[error("compile refused: {0}")]
    CompileLimit(String),
    /// The component does not target `herald:plugin/plugin@0.1.0`.
    #[error("component does not fit the herald:plugin@0.1.0 world: {0}")]
    WrongWorld(String),
    /// Instantiating or describing the plugin failed, or it declares no hook.
    #[error("plugin failed its load check: {0}")]
    Rejected(String),
    /// JavaScript source that does not load: it does not evaluate (a syntax error, with
    /// its line and column), `describe` is refused, or it defines no hook.
    #[error("JavaScript source refused: {0}")]
    Js(String),
    /// Reading or writing a plugin file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The WebAssembly engine could not be set up.
    #[error("plugin engine: {0}")]
    Engine(String),
    /// A rollback or a pinned binding to a version that is not stored.
    #[error("plugin {name:?} has no version {version}")]
    NoSuchVersion {
        /// The plugin.
        name: String,
        /// The version asked for.
        version: u32,
    },
    /// `run_hook_file` input that does not parse.
    #[error("invalid input: {0}")]
    Input(String),
    /// `run_hook_file`: the hook call failed. `report` is what the CLI prints besides the
    /// error: the JSON document of a run, with the `error` and the plugin's log lines.
    #[error("plugin:{failure}")]
    Call {
        /// Why.
        failure: PluginFailure,
        /// `{"hook", "error", "logs"}`, pretty-printed.
        report: String,
    },
}

impl PluginError {
    /// Whether the caller's input is at fault (an API maps these to 4xx).
    pub fn is_client_error(&self) -> bool {
        !matches!(self, PluginError::Io { .. } | PluginError::Engine(_))
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PluginError::Io { path: path.into(), source }
    }
}

pub use crate::model::{is_slug, split_pinned};

/// `value` as a tenant or plugin name (see [`is_slug`]), or the error naming `what`.
pub fn check_slug(what: &'static str, value: &str) -> Result<(), PluginError> {
    if is_slug(value) { Ok(()) } else { Err(PluginError::InvalidName { what, value: value.to_string() }) }
}
