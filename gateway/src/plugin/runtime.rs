//! The sandbox: one wasmtime engine, compiled plugin versions, and bounded hook calls.
//!
//! A [`LoadedPlugin`] is one immutable version of one tenant's plugin: its
//! pre-instantiated component (`InstancePre`, type-checked against the world once),
//! what its `describe` said, and a small pool of warm instances.
//!
//! # Instance reuse
//!
//! Instantiating a component, even from the pooling allocator with copy-on-write
//! memory, costs more than a typical hook call. So a call takes a warm instance (its
//! own `Store`) from the version's pool and gives it back afterwards, but only when
//! all of these hold, which is what makes reuse safe:
//! - the instance has only ever served this one version of this one tenant's plugin
//!   (pools hang off the version, so tenants never share an instance);
//! - the previous call returned normally: a trap, timeout or memory-cap hit discards
//!   the instance, so no half-updated guest state is ever re-entered;
//! - before each call the store's per-call state (deadline, WASI context with its clock
//!   and random seeded by the attempt, log budget, attempt id) is reset; the memory cap
//!   and the hostcall fuel are properties of the store and still apply;
//! - WASI grants nothing, so an instance holds no handle to anything outside itself;
//! - an instance is retired after [`MAX_CALLS_PER_INSTANCE`] calls, bounding whatever
//!   a leaky plugin accumulates in its own heap.
//!
//! Warm instances hold pooling-allocator slots, so they are kept only while they are
//! used: the one the `describe` call at load ran on is kept (so the load, not the first
//! delivery, pays for instantiating it), one idle for `warm_idle` is dropped by the
//! registry's sweeper, and all plugins together keep at most half the slots warm. A
//! loaded plugin that serves no calls holds no slot past `warm_idle`, however many a
//! tenant installs.
//!
//! What a plugin may observe is that its globals can survive between calls of the same
//! version; the SDK documents that plugins must not rely on that either way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Engine, Store};

use super::bindings::herald::plugin::types as wit;
use super::bindings::{Plugin as Bindings, PluginPre};
use super::compile::Compiler;
use super::engine::build_engine;
use super::js::{self, JsRuntime, Source};
use super::output::{
    MAX_REASON, check_headers, check_verdict, failure_from, is_pool_exhausted, root_message, strip_reserved, truncate,
};
use super::sandbox::{self, CALL_FUEL, CallLimits, HostState, JsSource, LogCapture, QuietRate};
use super::ticker::Ticker;
use super::types::{Hook, HookSet, PluginConfig, PluginError, PluginFailure, StructureLimits, TenantLimits};
use super::{DeliveryContext, Header, Outcome, Request, TransformResult, Verdict};

/// A warm instance serves at most this many calls before it is replaced.
pub(crate) const MAX_CALLS_PER_INSTANCE: u32 = 10_000;
/// The engine, linker and call limits shared by every plugin of one host.
pub(crate) struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    limits: Limits,
    /// The limits of tenants with their own `[plugins.tenant.<tenant>]` table.
    tenant_limits: HashMap<String, TenantLimits>,
    /// The limits of every other tenant (the global values).
    default_limits: TenantLimits,
    /// Which tenants set which limits themselves, for naming a limit's key.
    key_names: PluginConfig,
    structure: StructureLimits,
    compiler: Compiler,
    js: JsRuntime,
    /// Warm instances kept, over every plugin; at most `max_warm`.
    warm_total: AtomicUsize,
    max_warm: usize,
    ticker: Arc<Ticker>,
}

/// What the host may copy out of a guest in one host call: the output cap, and room for
/// the rest of a hook's result.
fn hostcall_fuel(limits: &Limits) -> usize {
    limits.max_output_bytes.saturating_add(64 << 10)
}

/// The config keys of a plugin's limits (its tenant's own, or the global ones).
struct LimitKeys {
    call_timeout: String,
    call_timeout_per_mib: String,
    memory: String,
}

#[derive(Clone, Copy)]
struct Limits {
    max_output_bytes: usize,
    warm_per_plugin: usize,
}

impl Runtime {
    /// Builds the engine (pooling allocator, copy-on-write memory images, epoch
    /// interruption) and starts the epoch ticker thread, which stops when the engine
    /// is dropped.
    pub(crate) fn new(cfg: &PluginConfig) -> Result<Arc<Runtime>, PluginError> {
        let engine = build_engine(cfg).map_err(|e| PluginError::Engine(e.to_string()))?;
        let compiler = Compiler::new(&engine, cfg)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| PluginError::Engine(e.to_string()))?;
        Bindings::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| PluginError::Engine(e.to_string()))?;
        sandbox::link_insecure_seed(&mut linker).map_err(|e| PluginError::Engine(e.to_string()))?;
        js::link(&mut linker).map_err(|e| PluginError::Engine(e.to_string()))?;
        let js = JsRuntime::new(cfg, compiler.engine_key().to_string());
        let ticker = Ticker::start(&engine)?;
        let limits = Limits { max_output_bytes: cfg.max_output_bytes, warm_per_plugin: cfg.warm_instances_per_plugin };
        let tenant_limits = cfg.tenant_limits.keys().map(|t| (t.clone(), cfg.limits(t))).collect();
        Ok(Arc::new(Runtime {
            engine,
            linker,
            limits,
            tenant_limits,
            default_limits: cfg.limits(""),
            key_names: PluginConfig { tenant_limits: cfg.tenant_limits.clone(), ..PluginConfig::new("") },
            structure: cfg.structure,
            compiler,
            js,
            ticker,
            warm_total: AtomicUsize::new(0),
            max_warm: (cfg.max_instances as usize / 2).max(1),
        }))
    }

    /// Checks, compiles (or maps from the cache) and validates a plugin: a component
    /// of the right world within the structural limits, whose `describe` succeeds and
    /// declares at least one hook. CPU-heavy: call it off the async runtime.
    pub(crate) fn load(
        self: &Arc<Self>,
        tenant: &str,
        name: &str,
        bytes: &[u8],
        config: HashMap<String, String>,
    ) -> Result<Arc<LoadedPlugin>, PluginError> {
        let started = Instant::now();
        let sha256 = hex::encode(Sha256::digest(bytes));
        let limits = self.limits_of(tenant);
        let (pre, js_source, memory_limit) = match js::detect(bytes)? {
            Source::Component => (self.pre_component(bytes, &sha256)?, None, limits.memory_limit),
            Source::Js(text) => {
                let pre = self.js.pre(&self.engine, &self.linker)?;
                (pre, Some(Arc::from(text)), limits.js_memory_limit)
            }
        };
        let mut plugin = LoadedPlugin {
            runtime: Arc::clone(self),
            pre,
            tenant: tenant.into(),
            name: name.into(),
            config: Arc::new(config),
            hooks: HookSet::default(),
            plugin_name: String::new(),
            plugin_version: String::new(),
            classify_statuses: None,
            sha256,
            size: bytes.len() as u64,
            loaded_at: crate::clock::wall(),
            load_time: Duration::ZERO,
            warm: Mutex::new(Vec::new()),
            runs_long: AtomicBool::new(false),
            quiet_rate: QuietRate::default(),
            memory_limit,
            call_limits: CallLimits::of(&limits),
            limit_keys: Arc::new(self.limit_keys(tenant, js_source.is_some())),
            js_source,
        };
        let checked = plugin.check_describe();
        checked.map_err(|e| if plugin.is_js() { js::as_js_error(e) } else { e })?;
        plugin.load_time = started.elapsed();
        Ok(Arc::new(plugin))
    }

    /// The keys that set `tenant`'s limits, for a plugin of that kind (`js`).
    fn limit_keys(&self, tenant: &str, js: bool) -> LimitKeys {
        let keys = &self.key_names;
        LimitKeys {
            call_timeout: keys.limit_key(tenant, "call_timeout"),
            call_timeout_per_mib: keys.limit_key(tenant, "call_timeout_per_mib"),
            memory: keys.limit_key(tenant, if js { "js_memory_limit" } else { "memory_limit" }),
        }
    }

    /// The limits of `tenant`'s plugins: its own table's, else the global values.
    pub(crate) fn limits_of(&self, tenant: &str) -> TenantLimits {
        self.tenant_limits.get(tenant).copied().unwrap_or(self.default_limits)
    }

    /// A component's pre-instance: structure checked, compiled or mapped from the cache,
    /// linked against the world.
    fn pre_component(&self, bytes: &[u8], sha256: &str) -> Result<PluginPre<HostState>, PluginError> {
        super::inspect::inspect(bytes, &self.structure)?;
        let component = self.compiler.component(bytes, sha256)?;
        let instance_pre =
            self.linker.instantiate_pre(&component).map_err(|e| PluginError::WrongWorld(root_message(&e)))?;
        PluginPre::new(instance_pre).map_err(|e| PluginError::WrongWorld(root_message(&e)))
    }

    #[cfg(test)]
    pub(crate) fn ticker_sleeping(&self) -> bool {
        self.ticker.parked.load(Ordering::SeqCst)
    }

    /// Whether the compile cache holds an artifact of `bytes` (loading is then cheap).
    pub(crate) fn is_cached(&self, bytes: &[u8]) -> bool {
        match js::detect(bytes) {
            Ok(Source::Js(_)) => self.js.is_cached(),
            _ => self.compiler.is_cached(&hex::encode(Sha256::digest(bytes))),
        }
    }

    /// `None` when JavaScript sources can run; else where the runtime was looked for (for
    /// `herald plugin check|run`, whose user is the operator or the author).
    pub(crate) fn js_missing(&self) -> Option<String> {
        self.js.missing()
    }

    /// The import names of a loaded plugin (for `herald plugin check`).
    pub(crate) fn imports(&self, plugin: &LoadedPlugin) -> Vec<String> {
        let ty = plugin.pre.instance_pre().component().component_type();
        ty.imports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }
}

/// One immutable version of one tenant's plugin.
pub(crate) struct LoadedPlugin {
    runtime: Arc<Runtime>,
    pre: PluginPre<HostState>,
    pub(crate) tenant: Arc<str>,
    pub(crate) name: Arc<str>,
    config: Arc<HashMap<String, String>>,
    pub(crate) hooks: HookSet,
    pub(crate) plugin_name: String,
    pub(crate) plugin_version: String,
    /// The only response statuses `classify` is called for (`None`: every outcome).
    pub(crate) classify_statuses: Option<Vec<u16>>,
    pub(crate) sha256: String,
    pub(crate) size: u64,
    pub(crate) loaded_at: SystemTime,
    /// How long loading it took: compiling or mapping the artifact, instantiating it and
    /// calling `describe` (for JavaScript, evaluating the source). Paid by the upload or
    /// the reload, reported apart from calls' durations.
    pub(crate) load_time: Duration,
    warm: Mutex<Vec<WarmInstance>>,
    /// The last call used more than `pool::DEMOTE_AFTER` of CPU.
    runs_long: AtomicBool,
    /// Its guest's speed on a quiet machine, from its own calls.
    quiet_rate: QuietRate,
    /// JavaScript source, for a plugin that runs on the JavaScript runtime.
    js_source: JsSource,
    /// This version's linear memory cap (its tenant's, for its kind).
    memory_limit: usize,
    /// Its tenant's time budget.
    call_limits: CallLimits,
    /// The config keys of its limits, for the failures that hit them.
    limit_keys: Arc<LimitKeys>,
}

struct WarmInstance {
    store: Store<HostState>,
    bindings: Bindings,
    calls: u32,
    /// When it last went back to the warm pool.
    idle_since: Instant,
}

impl LoadedPlugin {
    /// Calls `describe` (which also evaluates a JavaScript source) and takes what it says.
    fn check_describe(&mut self) -> Result<(), PluginError> {
        let load_ctx = DeliveryContext {
            tenant: self.tenant.to_string(),
            endpoint_id: String::new(),
            event_id: String::new(),
            event_type: String::new(),
            attempt: 0,
            timestamp: 0,
            attempt_id: "load".to_string(),
        };
        // What `describe` returns is cut to 128 bytes a string below, so the host lets it
        // copy two strings as large as the plugin's memory (a name and a version aliasing
        // all of it), not only the output cap: an over-long name is cut, not refused.
        let fuel = self.memory_limit.saturating_mul(2).saturating_add(64 << 10);
        let describe = |b: &Bindings, store: &mut Store<HostState>| {
            store.set_hostcall_fuel(fuel.max(self.runtime.limits.max_output_bytes));
            let info = b.call_describe(&mut *store);
            store.set_hostcall_fuel(hostcall_fuel(&self.runtime.limits));
            info
        };
        let info = self.call(&load_ctx, None, 0, describe).map_err(|f| match self.is_js() {
            true => js::describe_failed(f),
            false => PluginError::Rejected(format!("describe failed: plugin:{f}")),
        })?;
        // The instance `describe` ran on stays warm (within the warm budget, until idle for
        // `warm_idle`), so the load pays for instantiating and, for JavaScript, evaluating
        // the source, not the first delivery.
        self.describe_as(info)?;
        Ok(())
    }

    /// The same version with another configuration map and no warm instances, so the
    /// next call instantiates afresh (the SDK caches what it read from the old map).
    pub(crate) fn with_config(&self, config: HashMap<String, String>) -> LoadedPlugin {
        LoadedPlugin {
            runtime: Arc::clone(&self.runtime),
            pre: self.pre.clone(),
            tenant: Arc::clone(&self.tenant),
            name: Arc::clone(&self.name),
            config: Arc::new(config),
            hooks: self.hooks,
            plugin_name: self.plugin_name.clone(),
            plugin_version: self.plugin_version.clone(),
            classify_statuses: self.classify_statuses.clone(),
            sha256: self.sha256.clone(),
            size: self.size,
            loaded_at: self.loaded_at,
            load_time: self.load_time,
            warm: Mutex::new(Vec::new()),
            runs_long: AtomicBool::new(self.runs_long.load(Ordering::Relaxed)),
            // The same code: its speed is the same, whatever path the configuration takes.
            quiet_rate: QuietRate::copy(&self.quiet_rate),
            js_source: self.js_source.clone(),
            memory_limit: self.memory_limit,
            call_limits: self.call_limits,
            limit_keys: Arc::clone(&self.limit_keys),
        }
    }

    /// The configuration map this version's calls read.
    pub(crate) fn config(&self) -> &HashMap<String, String> {
        &self.config
    }

    /// Takes what `describe` said: at least one hook, and `classify` statuses only with
    /// the classify hook and only HTTP statuses.
    fn describe_as(&mut self, info: wit::PluginInfo) -> Result<(), PluginError> {
        self.hooks = HookSet {
            transform: info.hooks.contains(wit::Hooks::TRANSFORM),
            classify: info.hooks.contains(wit::Hooks::CLASSIFY),
            sign: info.hooks.contains(wit::Hooks::SIGN),
        };
        if self.hooks.is_empty() {
            return Err(PluginError::Rejected("describe declares no hook".to_string()));
        }
        self.plugin_name = truncate(info.name, 128);
        self.plugin_version = truncate(info.version, 128);
        if let Some(mut statuses) = info.classify_statuses {
            if !self.hooks.classify {
                return Err(PluginError::Rejected("describe lists classify statuses without the classify hook".into()));
            }
            if let Some(bad) = statuses.iter().find(|s| !(100..=599).contains(*s)) {
                return Err(PluginError::Rejected(format!("describe lists {bad}, which is not an HTTP status")));
            }
            statuses.sort_unstable();
            statuses.dedup();
            self.classify_statuses = Some(statuses);
        }
        Ok(())
    }

    /// Calls `transform` and validates its output.
    pub(crate) fn transform(
        &self,
        ctx: &DeliveryContext,
        request: &Request,
        logs: Option<&mut LogCapture>,
    ) -> Result<TransformResult, PluginFailure> {
        self.require(Hook::Transform)?;
        let result = self.call(ctx, logs, request.body.len(), |b, s| b.call_transform(s, ctx, request))?;
        match result.map_err(|e| PluginFailure::Guest(truncate(e, MAX_REASON)))? {
            TransformResult::Send(req) => Ok(TransformResult::Send(self.check_request(req)?)),
            TransformResult::Drop(reason) if reason.len() > self.runtime.limits.max_output_bytes => {
                Err(PluginFailure::OutputTooLarge)
            }
            TransformResult::Drop(reason) => Ok(TransformResult::Drop(truncate(reason, MAX_REASON))),
        }
    }

    /// Calls `classify` and validates its verdict.
    pub(crate) fn classify(
        &self,
        ctx: &DeliveryContext,
        outcome: &Outcome,
        logs: Option<&mut LogCapture>,
    ) -> Result<Verdict, PluginFailure> {
        self.require(Hook::Classify)?;
        if !self.wants(outcome) {
            return Ok(Verdict::Default);
        }
        let verdict = self.call(ctx, logs, 0, |b, s| b.call_classify(s, ctx, outcome))?;
        check_verdict(verdict, self.runtime.limits.max_output_bytes)
    }

    /// Calls `sign` and validates the headers it returns.
    pub(crate) fn sign(
        &self,
        ctx: &DeliveryContext,
        secrets: &[Vec<u8>],
        request: &Request,
        logs: Option<&mut LogCapture>,
    ) -> Result<Vec<Header>, PluginFailure> {
        self.require(Hook::Sign)?;
        let result = self.call(ctx, logs, request.body.len(), |b, s| b.call_sign(s, ctx, secrets, request))?;
        let headers = result.map_err(|e| PluginFailure::Guest(truncate(e, MAX_REASON)))?;
        let size: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        if size > self.runtime.limits.max_output_bytes {
            return Err(PluginFailure::OutputTooLarge);
        }
        check_headers(&headers)?;
        Ok(strip_reserved(headers))
    }

    /// Whether this version is JavaScript run by the shared runtime.
    pub(crate) fn is_js(&self) -> bool {
        self.js_source.is_some()
    }

    /// Does `classify` have an opinion on `outcome`? Transport errors always go to it.
    pub(crate) fn wants(&self, outcome: &Outcome) -> bool {
        match (&self.classify_statuses, outcome) {
            (Some(statuses), Outcome::Response(r)) => statuses.binary_search(&r.status).is_ok(),
            _ => true,
        }
    }

    fn require(&self, hook: Hook) -> Result<(), PluginFailure> {
        if self.hooks.contains(hook) { Ok(()) } else { Err(PluginFailure::HookNotImplemented) }
    }

    fn check_request(&self, mut req: Request) -> Result<Request, PluginFailure> {
        let size = req.body.len() + req.headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>();
        if size > self.runtime.limits.max_output_bytes {
            return Err(PluginFailure::OutputTooLarge);
        }
        check_headers(&req.headers)?;
        req.headers = strip_reserved(req.headers);
        Ok(req)
    }

    /// Runs one call on a warm or fresh instance, within the deadline and memory cap,
    /// and turns every way it can go wrong into a [`PluginFailure`].
    fn call<R>(
        &self,
        ctx: &DeliveryContext,
        logs: Option<&mut LogCapture>,
        input_bytes: usize,
        f: impl FnOnce(&Bindings, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginFailure> {
        // Instantiation runs guest code too: both are under the deadline.
        let _ticking = self.runtime.ticker.enter();
        let warm = self.warm.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut inst = match warm {
            Some(inst) => {
                self.runtime.warm_total.fetch_sub(1, Ordering::Relaxed);
                inst
            }
            None => self.instantiate()?,
        };
        let capture = logs.is_some();
        // A plugin whose last call ran long starts this one at idle priority, instead of
        // competing for a core for its first millisecond.
        if self.runs_long.load(Ordering::Relaxed) {
            super::pool::demote_long_call(Instant::now() + self.budget(input_bytes) * super::pool::STARVED_AFTER);
        }
        inst.store.data_mut().begin_call(ctx, capture);
        let budget = self.budget(input_bytes);
        let deadline = &mut inst.store.data_mut().deadline;
        deadline.budget = budget;
        deadline.fits = self.quiet_rate.fits(budget);
        inst.store.set_epoch_deadline(self.call_limits.first_check_ticks);
        // Fuel is enabled on every engine (`engine_config`), so setting it cannot fail.
        let _ = inst.store.set_fuel(CALL_FUEL);
        let result = f(&inst.bindings, &mut inst.store);
        // Fuel is exact once the guest has returned; a call interrupted by its deadline left
        // it where it last synchronised, so that call says nothing.
        if result.is_ok() {
            let used = CALL_FUEL.saturating_sub(inst.store.get_fuel().unwrap_or(CALL_FUEL));
            self.quiet_rate.sample(used, inst.store.data().deadline.cpu_used());
        }
        let state = inst.store.data_mut();
        self.runs_long.store(state.deadline.ran_long(), Ordering::Relaxed);
        state.end_call();
        if let Some(logs) = logs {
            logs.append(&mut state.captured);
        }
        match result {
            Ok(value) if !state.limiter.exceeded => {
                inst.calls += 1;
                self.recycle(inst);
                Ok(value)
            }
            Ok(_) => Err(self.name_limit(PluginFailure::Memory(String::new()), budget, state)),
            Err(err) => Err(self.name_limit(failure_from(&err, state.limiter.exceeded), budget, state)),
        }
    }

    /// A timeout or memory failure with the limit it hit and the key that sets it, as the
    /// attempt records it: `timeout: used its CPU budget of 10ms (plugins.call_timeout)`.
    ///
    /// A call stopped at its deadline while it had grown its memory by half its memory
    /// limit or more is a memory failure: it was spending its time allocating, and only
    /// the cost of touching fresh memory (a 64 MiB heap takes more than a 10 ms budget to
    /// fill) kept it from the cap. So an allocation loop is `memory` on any machine.
    fn name_limit(&self, failure: PluginFailure, budget: Duration, state: &HostState) -> PluginFailure {
        let keys = &self.limit_keys;
        let limits = &self.call_limits;
        // Shown to the millisecond; the part a small input adds is left out below that.
        let budget = Duration::from_millis(budget.as_millis().try_into().unwrap_or(u64::MAX));
        let cpu = match budget > limits.call_timeout {
            true => format!(
                "CPU budget of {budget:?} ({} {:?} + {} {:?} per MiB of input)",
                keys.call_timeout, limits.call_timeout, keys.call_timeout_per_mib, limits.call_timeout_per_mib
            ),
            false => format!("CPU budget of {:?} ({})", limits.call_timeout, keys.call_timeout),
        };
        let limit = match self.memory_limit % (1 << 20) {
            0 => format!("{} MiB", self.memory_limit >> 20),
            _ => format!("{} bytes", self.memory_limit),
        };
        let grown = state.limiter.grown;
        match failure {
            PluginFailure::Timeout(_) if grown >= self.memory_limit / 2 => PluginFailure::Memory(format!(
                "grew by {} MiB toward its memory limit of {limit} ({}) until its {cpu} ran out",
                grown >> 20,
                keys.memory
            )),
            PluginFailure::Timeout(_) => {
                let mut detail = match state.deadline.stopped_on_wall {
                    Some(wall) => {
                        format!("stopped after {wall:.0?} of wall time, the most a call with a {cpu} may take")
                    }
                    None => match state.deadline.fits {
                        true => format!(
                            "used its {cpu}: twice it, the most a call of a plugin whose calls fit it may take on a busy machine"
                        ),
                        false => format!("used its {cpu}"),
                    },
                };
                if grown >= 1 << 20 {
                    detail.push_str(&format!(", having grown by {} MiB of its memory limit of {limit}", grown >> 20));
                }
                PluginFailure::Timeout(detail)
            }
            PluginFailure::Memory(_) => {
                PluginFailure::Memory(format!("over its memory limit of {limit} ({})", keys.memory))
            }
            other => other,
        }
    }

    /// The CPU budget of a call whose input is `input_bytes`: `call_timeout`, plus
    /// `call_timeout_per_mib` for each MiB, so that the largest payload Herald accepts
    /// can go through a transform that reads and rewrites it.
    fn budget(&self, input_bytes: usize) -> Duration {
        let limits = &self.call_limits;
        let extra = limits.call_timeout_per_mib.as_nanos() * input_bytes as u128 / (1 << 20);
        limits.call_timeout + Duration::from_nanos(u64::try_from(extra).unwrap_or(u64::MAX))
    }

    fn instantiate(&self) -> Result<WarmInstance, PluginFailure> {
        let mut state = HostState::new(&self.tenant, &self.name, &self.config, self.memory_limit);
        state.js_source = self.js_source.clone();
        state.max_host_bytes = self.runtime.limits.max_output_bytes;
        let mut store = Store::new(&self.runtime.engine, state);
        store.limiter(|s| &mut s.limiter);
        // What the host copies out of the guest in one host call (a log line, or the
        // result of a hook: strings and lists, aliased or not) is bounded by the output
        // cap, not by wasmtime's default of 128 MiB: a guest returning many aliases of
        // one buffer is refused after copying at most the cap.
        store.set_hostcall_fuel(hostcall_fuel(&self.runtime.limits));
        let limits = self.call_limits;
        store.epoch_deadline_callback(move |mut ctx| Ok(ctx.data_mut().deadline.on_expiry(limits.call_timeout)));
        store.data_mut().deadline.start();
        store.set_epoch_deadline(limits.first_check_ticks);
        let _ = store.set_fuel(CALL_FUEL);
        match self.pre.instantiate(&mut store) {
            Ok(bindings) => Ok(WarmInstance { store, bindings, calls: 0, idle_since: Instant::now() }),
            Err(err) if is_pool_exhausted(&err) => Err(PluginFailure::Busy),
            Err(err) => {
                let state = store.data();
                Err(self.name_limit(failure_from(&err, state.limiter.exceeded), limits.call_timeout, state))
            }
        }
    }

    fn recycle(&self, mut inst: WarmInstance) {
        if inst.calls >= MAX_CALLS_PER_INSTANCE {
            return;
        }
        let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        let runtime = &self.runtime;
        if warm.len() >= runtime.limits.warm_per_plugin {
            return;
        }
        // Take a place in the budget of all plugins first; give it back if it is full.
        if runtime.warm_total.fetch_add(1, Ordering::Relaxed) >= runtime.max_warm {
            runtime.warm_total.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        inst.idle_since = Instant::now();
        warm.push(inst);
    }

    /// Drops the warm instances unused since before `cutoff`, freeing their slots.
    pub(crate) fn drop_idle(&self, cutoff: Instant) {
        self.drop_warm(|inst| inst.idle_since < cutoff);
    }

    /// How many warm instances this version keeps.
    pub(crate) fn warm_count(&self) -> usize {
        self.warm.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn drop_warm(&self, drop_it: impl Fn(&WarmInstance) -> bool) {
        let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        let before = warm.len();
        warm.retain(|inst| !drop_it(inst));
        self.runtime.warm_total.fetch_sub(before - warm.len(), Ordering::Relaxed);
    }
}

impl Drop for LoadedPlugin {
    fn drop(&mut self) {
        self.drop_warm(|_| true);
    }
}
