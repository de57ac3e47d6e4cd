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
//! used: none is kept from the `describe` call at load, one idle for `warm_idle` is
//! dropped by the registry's sweeper, and all plugins together keep at most half the
//! slots warm. A loaded plugin that serves no calls holds no slot, however many a
//! tenant installs.
//!
//! What a plugin may observe is that its globals can survive between calls of the same
//! version; the SDK documents that plugins must not rely on that either way.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rand::{RngCore as _, SeedableRng as _};
use sha2::{Digest, Sha256};
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::herald::plugin::{host, types as wit};
use super::bindings::{Plugin as Bindings, PluginPre};
use super::compile::Compiler;
use super::types::{Hook, HookSet, PluginConfig, PluginError, PluginFailure, StructureLimits};
use super::{DeliveryContext, Header, Outcome, Request, TransformResult, Verdict};

/// A warm instance serves at most this many calls before it is replaced.
pub(crate) const MAX_CALLS_PER_INSTANCE: u32 = 10_000;
/// How often the epoch advances; the granularity of call deadlines.
const EPOCH_TICK: Duration = Duration::from_millis(1);
/// A log line longer than this is truncated.
const MAX_LOG_LINE: usize = 1024;
/// Log lines past this many in one call are counted, not written.
const MAX_LOG_LINES_PER_CALL: u32 = 32;
/// Reasons and names in plugin output longer than this are truncated.
const MAX_REASON: usize = 1024;
/// The longest pause a plugin may ask for: seven days.
const MAX_PAUSE_SECS: u32 = 7 * 24 * 3600;
/// Most headers one call may return: a list of many tiny headers is as costly to check,
/// store and send as a big body, and no webhook needs more.
const MAX_HEADERS: usize = 64;
/// Headers the sender owns: removed from what plugins return.
const RESERVED_HEADERS: [&str; 5] = ["host", "content-length", "transfer-encoding", "connection", "upgrade"];

/// The engine, linker and call limits shared by every plugin of one host.
pub(crate) struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    limits: Limits,
    structure: StructureLimits,
    compiler: Compiler,
    /// Warm instances kept, over every plugin; at most `max_warm`.
    warm_total: AtomicUsize,
    max_warm: usize,
}

#[derive(Clone, Copy)]
struct Limits {
    deadline_ticks: u64,
    call_timeout: Duration,
    memory_limit: usize,
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
        spawn_epoch_ticker(&engine)?;
        let tick = EPOCH_TICK.as_nanos().max(1);
        let deadline_ticks = (cfg.call_timeout.as_nanos().div_ceil(tick) as u64).max(1);
        let limits = Limits {
            deadline_ticks,
            call_timeout: cfg.call_timeout,
            memory_limit: cfg.memory_limit,
            max_output_bytes: cfg.max_output_bytes,
            warm_per_plugin: cfg.warm_instances_per_plugin,
        };
        Ok(Arc::new(Runtime {
            engine,
            linker,
            limits,
            structure: cfg.structure,
            compiler,
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
        super::inspect::inspect(bytes, &self.structure)?;
        let sha256 = hex::encode(Sha256::digest(bytes));
        let component = self.compiler.component(bytes, &sha256)?;
        let instance_pre =
            self.linker.instantiate_pre(&component).map_err(|e| PluginError::WrongWorld(root_message(&e)))?;
        let pre = PluginPre::new(instance_pre).map_err(|e| PluginError::WrongWorld(root_message(&e)))?;
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
            warm: Mutex::new(Vec::new()),
        };
        let load_ctx = DeliveryContext {
            tenant: tenant.to_string(),
            endpoint_id: String::new(),
            event_id: String::new(),
            event_type: String::new(),
            attempt: 0,
            timestamp: 0,
            attempt_id: "load".to_string(),
        };
        let info = plugin
            .call(&load_ctx, None, |b, store| b.call_describe(store))
            .map_err(|f| PluginError::Rejected(format!("describe failed: plugin:{f}")))?;
        // Loading is not a use: keep no slot for a plugin nobody calls yet.
        plugin.drop_warm(|_| true);
        plugin.hooks = HookSet {
            transform: info.hooks.contains(wit::Hooks::TRANSFORM),
            classify: info.hooks.contains(wit::Hooks::CLASSIFY),
            sign: info.hooks.contains(wit::Hooks::SIGN),
        };
        if plugin.hooks.is_empty() {
            return Err(PluginError::Rejected("describe declares no hook".to_string()));
        }
        plugin.plugin_name = truncate(info.name, 128);
        plugin.plugin_version = truncate(info.version, 128);
        if let Some(mut statuses) = info.classify_statuses {
            if !plugin.hooks.classify {
                return Err(PluginError::Rejected("describe lists classify statuses without the classify hook".into()));
            }
            if let Some(bad) = statuses.iter().find(|s| !(100..=599).contains(*s)) {
                return Err(PluginError::Rejected(format!("describe lists {bad}, which is not an HTTP status")));
            }
            statuses.sort_unstable();
            statuses.dedup();
            plugin.classify_statuses = Some(statuses);
        }
        Ok(Arc::new(plugin))
    }

    /// Whether the compile cache holds an artifact of `bytes` (loading is then cheap).
    pub(crate) fn is_cached(&self, bytes: &[u8]) -> bool {
        self.compiler.is_cached(&hex::encode(Sha256::digest(bytes)))
    }

    /// The import names of a loaded plugin (for `herald plugin check`).
    pub(crate) fn imports(&self, plugin: &LoadedPlugin) -> Vec<String> {
        let ty = plugin.pre.instance_pre().component().component_type();
        ty.imports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }
}

/// The engine `herald plugin compile` compiles with: the server's code-generation
/// settings (so its artifacts load there), without the instance pool.
pub(crate) fn compile_engine() -> wasmtime::Result<Engine> {
    let mut config = engine_config();
    // One core: the node's other core keeps serving while a plugin compiles.
    config.parallel_compilation(false);
    Engine::new(&config)
}

fn build_engine(cfg: &PluginConfig) -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    let instances = cfg.max_instances.max(1);
    pool.total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(8))
        .max_core_instances_per_component(16)
        .total_memories(instances.saturating_mul(2))
        .max_memories_per_component(2)
        .total_tables(instances.saturating_mul(8))
        .max_tables_per_component(8)
        .max_memory_size(cfg.memory_limit)
        .total_stacks(0);
    let mut config = engine_config();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
}

/// What compiled code depends on; shared by the server and the compiler child.
fn engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .epoch_interruption(true)
        .memory_init_cow(true)
        // A 4 GiB reservation plus a guard region covers every 32-bit address a guest
        // can form, so compiled code needs no bounds check on each load and store
        // (explicit checks made the example plugins' calls 7–11 % slower). It is address
        // space only (PROT_NONE, never committed): 2 memories × 1000 slots ≈ 8 TiB of the
        // 128 TiB a process has. The memory cap is enforced on growth, not by the mapping.
        .memory_reservation(4 << 30)
        .memory_guard_size(32 << 20)
        .memory_reservation_for_growth(0)
        .max_wasm_stack(512 << 10);
    config
}

fn spawn_epoch_ticker(engine: &Engine) -> Result<(), PluginError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("herald-plugin-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .map(|_| ())
        .map_err(|e| PluginError::Engine(format!("cannot start the epoch thread: {e}")))
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
    warm: Mutex<Vec<WarmInstance>>,
}

struct WarmInstance {
    store: Store<HostState>,
    bindings: Bindings,
    calls: u32,
    /// When it last went back to the warm pool.
    idle_since: Instant,
}

/// Log lines of one call, kept when the caller asks (the CLI does).
pub(crate) type LogCapture = Vec<(&'static str, String)>;

impl LoadedPlugin {
    /// Calls `transform` and validates its output.
    pub(crate) fn transform(
        &self,
        ctx: &DeliveryContext,
        request: &Request,
        logs: Option<&mut LogCapture>,
    ) -> Result<TransformResult, PluginFailure> {
        self.require(Hook::Transform)?;
        let result = self.call(ctx, logs, |b, s| b.call_transform(s, ctx, request))?;
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
        let verdict = self.call(ctx, logs, |b, s| b.call_classify(s, ctx, outcome))?;
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
        let result = self.call(ctx, logs, |b, s| b.call_sign(s, ctx, secrets, request))?;
        let headers = result.map_err(|e| PluginFailure::Guest(truncate(e, MAX_REASON)))?;
        let size: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        if size > self.runtime.limits.max_output_bytes {
            return Err(PluginFailure::OutputTooLarge);
        }
        check_headers(&headers)?;
        Ok(strip_reserved(headers))
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
        f: impl FnOnce(&Bindings, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginFailure> {
        let warm = self.warm.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut inst = match warm {
            Some(inst) => {
                self.runtime.warm_total.fetch_sub(1, Ordering::Relaxed);
                inst
            }
            None => self.instantiate()?,
        };
        let capture = logs.is_some();
        inst.store.data_mut().begin_call(ctx, capture);
        inst.store.set_epoch_deadline(self.runtime.limits.deadline_ticks);
        let result = f(&inst.bindings, &mut inst.store);
        let state = inst.store.data_mut();
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
            Ok(_) => Err(PluginFailure::Memory),
            Err(err) => Err(failure_from(&err, state.limiter.exceeded)),
        }
    }

    fn instantiate(&self) -> Result<WarmInstance, PluginFailure> {
        let state = HostState::new(self, self.runtime.limits.memory_limit);
        let mut store = Store::new(&self.runtime.engine, state);
        store.limiter(|s| &mut s.limiter);
        // What the host copies out of the guest in one host call (a log line, or the
        // result of a hook: strings and lists, aliased or not) is bounded by the output
        // cap, not by wasmtime's default of 128 MiB: a guest returning many aliases of
        // one buffer is refused after copying at most the cap.
        store.set_hostcall_fuel(self.runtime.limits.max_output_bytes.saturating_add(64 << 10));
        let limits = self.runtime.limits;
        store.epoch_deadline_callback(move |mut ctx| Ok(ctx.data_mut().deadline.on_expiry(&limits)));
        store.data_mut().deadline.start();
        store.set_epoch_deadline(limits.deadline_ticks);
        match self.pre.instantiate(&mut store) {
            Ok(bindings) => Ok(WarmInstance { store, bindings, calls: 0, idle_since: Instant::now() }),
            Err(err) if is_pool_exhausted(&err) => Err(PluginFailure::Busy),
            Err(err) => Err(failure_from(&err, store.data().limiter.exceeded)),
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

/// Per-store host state: WASI (granting nothing), the memory limiter, and the
/// current call's context for logs, config and the clock.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    config: Arc<HashMap<String, String>>,
    tenant: Arc<str>,
    plugin: Arc<str>,
    attempt_id: String,
    deadline: Deadline,
    log_lines: u32,
    capture: bool,
    captured: LogCapture,
}

impl HostState {
    fn new(plugin: &LoadedPlugin, memory_limit: usize) -> Self {
        HostState {
            wasi: wasi_context(0, ""),
            table: ResourceTable::new(),
            limiter: MemoryLimiter { limit: memory_limit, exceeded: false },
            config: Arc::clone(&plugin.config),
            tenant: Arc::clone(&plugin.tenant),
            plugin: Arc::clone(&plugin.name),
            attempt_id: String::new(),
            deadline: Deadline::default(),
            log_lines: 0,
            capture: false,
            captured: Vec::new(),
        }
    }

    fn begin_call(&mut self, ctx: &DeliveryContext, capture: bool) {
        self.attempt_id.clear();
        self.attempt_id.push_str(&ctx.attempt_id);
        self.wasi = wasi_context(ctx.timestamp, &ctx.attempt_id);
        self.deadline.start();
        self.log_lines = 0;
        self.capture = capture;
        self.limiter.exceeded = false;
    }

    fn end_call(&mut self) {
        if self.log_lines > MAX_LOG_LINES_PER_CALL {
            tracing::warn!(
                tenant = %self.tenant,
                plugin = %self.plugin,
                attempt_id = %self.attempt_id,
                dropped = self.log_lines - MAX_LOG_LINES_PER_CALL,
                "plugin log lines dropped"
            );
        }
    }
}

/// WASI for one call, granting nothing: no files, environment, sockets or name
/// lookups (those calls fail with an error the guest sees); stdin is empty and
/// stdout/stderr are discarded (a plugin logs through `log`); the wall clock reads the
/// attempt's `timestamp`, the monotonic clock is frozen; random sources are ChaCha
/// streams seeded from the attempt id, so they differ per attempt and repeat for the
/// same attempt id. Built afresh for every call, so no call sees the random state
/// another left behind.
fn wasi_context(timestamp: u64, attempt_id: &str) -> WasiCtx {
    let seed = |domain: &str| -> [u8; 32] {
        Sha256::new().chain_update(domain).chain_update([0]).chain_update(attempt_id).finalize().into()
    };
    let insecure_seed = seed("herald:wasi-insecure-seed");
    WasiCtxBuilder::new()
        .wall_clock(ContextClock(timestamp))
        .monotonic_clock(FrozenClock)
        .secure_random(AttemptRng(rand::rngs::StdRng::from_seed(seed("herald:wasi-random"))))
        .insecure_random(AttemptRng(rand::rngs::StdRng::from_seed(seed("herald:wasi-insecure-random"))))
        .insecure_random_seed(u128::from_le_bytes(insecure_seed[..16].try_into().unwrap_or_default()))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}

/// A ChaCha stream behind the RNG trait of wasmtime-wasi's `rand` version.
struct AttemptRng(rand::rngs::StdRng);

impl rand_core::TryRng for AttemptRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.0.next_u32())
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.0.fill_bytes(dst);
        Ok(())
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl wit::Host for HostState {}

impl host::Host for HostState {
    fn log(&mut self, level: wit::Level, message: String) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES_PER_CALL {
            return;
        }
        let message = truncate(message, MAX_LOG_LINE);
        let (tenant, plugin, attempt_id) = (&*self.tenant, &*self.plugin, self.attempt_id.as_str());
        macro_rules! emit {
            ($lvl:expr) => {
                tracing::event!(target: "herald::plugin::guest", $lvl, tenant, plugin, attempt_id, "{message}")
            };
        }
        let name = match level {
            wit::Level::Trace => {
                emit!(tracing::Level::TRACE);
                "trace"
            }
            wit::Level::Debug => {
                emit!(tracing::Level::DEBUG);
                "debug"
            }
            wit::Level::Info => {
                emit!(tracing::Level::INFO);
                "info"
            }
            wit::Level::Warn => {
                emit!(tracing::Level::WARN);
                "warn"
            }
            wit::Level::Error => {
                emit!(tracing::Level::ERROR);
                "error"
            }
        };
        if self.capture {
            self.captured.push((name, message));
        }
    }

    fn get_config(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }
}

/// The time budget of a call: `call_timeout` of CPU time spent by the call's thread.
/// The epoch deadline measures wall time, which a busy host can eat by preempting the
/// thread; so when it expires, the call is stopped only if the thread has spent the
/// whole budget on the CPU since the call started, and otherwise gets a new epoch
/// deadline for the CPU time it has left (at least one tick). A spinning guest thus
/// stops after `call_timeout` of CPU plus at most one tick (1 ms); a legal call is never
/// cut for having been preempted, however early; a starved one is stopped after 10x
/// `call_timeout` of wall time. Without a thread CPU clock the wall deadline alone
/// applies.
#[derive(Default)]
struct Deadline {
    started: Option<Instant>,
    cpu_start: Option<Duration>,
}

impl Deadline {
    fn start(&mut self) {
        self.started = Some(Instant::now());
        self.cpu_start = thread_cpu_time();
    }

    fn on_expiry(&mut self, limits: &Limits) -> UpdateDeadline {
        let wall = self.started.map(|s| s.elapsed()).unwrap_or(Duration::MAX);
        if wall >= limits.call_timeout.saturating_mul(10) {
            return UpdateDeadline::Interrupt;
        }
        let (Some(start), Some(now)) = (self.cpu_start, thread_cpu_time()) else {
            return UpdateDeadline::Interrupt;
        };
        let left = limits.call_timeout.saturating_sub(now.saturating_sub(start));
        if left.is_zero() {
            return UpdateDeadline::Interrupt;
        }
        let ticks = left.as_nanos().div_ceil(EPOCH_TICK.as_nanos().max(1));
        UpdateDeadline::Continue(u64::try_from(ticks).unwrap_or(u64::MAX).max(1))
    }
}

#[cfg(unix)]
fn thread_cpu_time() -> Option<Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Some(Duration::new(u64::try_from(t.tv_sec).ok()?, u32::try_from(t.tv_nsec).ok()?))
}

#[cfg(not(unix))]
fn thread_cpu_time() -> Option<Duration> {
    None
}

/// Caps linear memory and remembers that the cap was hit, so that the trap a guest
/// raises after a failed allocation is reported as `memory`, not as a generic trap.
struct MemoryLimiter {
    limit: usize,
    exceeded: bool,
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.exceeded = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// WASI's wall clock reads the attempt's timestamp, nothing ambient.
struct ContextClock(u64);

impl wasmtime_wasi::HostWallClock for ContextClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::from_secs(self.0)
    }
}

/// WASI's monotonic clock does not move.
struct FrozenClock;

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

fn failure_from(err: &wasmtime::Error, memory_exceeded: bool) -> PluginFailure {
    if memory_exceeded {
        return PluginFailure::Memory;
    }
    // `exit()` in a guest (Rust's `std::process::exit`, or the abort after a panic on
    // some toolchains) is the guest ending the call: a trap with its status.
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return PluginFailure::Trap(format!("exit({})", exit.0));
    }
    // wasmtime's error type for this is private, so it is recognised by its message
    // (`aliased_output_is_refused_before_the_host_copies_it` notices if that changes).
    if err.chain().any(|e| e.to_string().contains("fuel allocated for hostcalls has been exhausted")) {
        return PluginFailure::OutputTooLarge;
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => PluginFailure::Timeout,
        Some(Trap::StackOverflow) => PluginFailure::Trap("stack overflow".to_string()),
        Some(trap) => PluginFailure::Trap(truncate(trap.to_string(), 200)),
        // Not a trap: the canonical ABI refused what the guest handed back (bad
        // UTF-8, out-of-bounds list, unknown discriminant, …).
        // The root cause only: the context above it is a wasm backtrace.
        None => PluginFailure::InvalidOutput(truncate(err.root_cause().to_string(), 200)),
    }
}

fn is_pool_exhausted(err: &wasmtime::Error) -> bool {
    err.downcast_ref::<wasmtime::PoolConcurrencyLimitError>().is_some()
}

pub(crate) fn root_message(err: &wasmtime::Error) -> String {
    let mut msg = err.to_string();
    for cause in err.chain().skip(1) {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
    }
    msg
}

/// Reasons over the output cap are an error; within it they are cut to 1 KiB.
fn check_verdict(verdict: Verdict, max_output_bytes: usize) -> Result<Verdict, PluginFailure> {
    let reason_len = match &verdict {
        Verdict::Fail(r) | Verdict::DisableEndpoint(r) | Verdict::PauseEndpoint(super::Pause { reason: r, .. }) => {
            r.len()
        }
        _ => 0,
    };
    if reason_len > max_output_bytes {
        return Err(PluginFailure::OutputTooLarge);
    }
    Ok(match verdict {
        Verdict::Fail(reason) => Verdict::Fail(truncate(reason, MAX_REASON)),
        Verdict::DisableEndpoint(reason) => Verdict::DisableEndpoint(truncate(reason, MAX_REASON)),
        Verdict::PauseEndpoint(p) if p.secs == 0 || p.secs > MAX_PAUSE_SECS => {
            return Err(PluginFailure::InvalidOutput(format!(
                "pause-endpoint of {} s (allowed: 1..={MAX_PAUSE_SECS})",
                p.secs
            )));
        }
        Verdict::PauseEndpoint(mut p) => {
            p.reason = truncate(p.reason, MAX_REASON);
            Verdict::PauseEndpoint(p)
        }
        other => other,
    })
}

/// At most [`MAX_HEADERS`]; names must be HTTP tokens and values visible ASCII or
/// spaces, as the WIT says (no control characters, no raw UTF-8).
fn check_headers(headers: &[Header]) -> Result<(), PluginFailure> {
    if headers.len() > MAX_HEADERS {
        return Err(PluginFailure::InvalidOutput(format!("{} headers (at most {MAX_HEADERS})", headers.len())));
    }
    for (name, value) in headers {
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || name.len() > 256 || !name.bytes().all(token) {
            return Err(PluginFailure::InvalidOutput(format!("bad header name {:?}", truncate(name.clone(), 64))));
        }
        if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(PluginFailure::InvalidOutput(format!("header {name}: values must be visible ASCII or spaces")));
        }
    }
    Ok(())
}

/// Drops the headers the sender owns (`host`, `content-length`, …): a plugin reshapes
/// the message, never the destination or the framing.
fn strip_reserved(mut headers: Vec<Header>) -> Vec<Header> {
    headers.retain(|(n, _)| !RESERVED_HEADERS.iter().any(|r| n.eq_ignore_ascii_case(r)));
    headers
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_cpu_time_so_a_preempted_call_is_not_cut() {
        let limits = Limits {
            deadline_ticks: 10,
            call_timeout: Duration::from_millis(10),
            memory_limit: 0,
            max_output_bytes: 0,
            warm_per_plugin: 0,
        };
        let spin = |cpu: Duration| {
            let start = thread_cpu_time().unwrap();
            while thread_cpu_time().unwrap() - start < cpu {}
        };
        let mut deadline = Deadline::default();
        deadline.start();
        // Preempted for longer than the budget before running at all (wall time passes,
        // no CPU is spent): not cut.
        std::thread::sleep(Duration::from_millis(15));
        assert!(matches!(deadline.on_expiry(&limits), UpdateDeadline::Continue(_)));
        // Then 6 ms of CPU: 6 of 10 spent, still legal (a rule that judged only the
        // window since the last expiry would stop it here).
        spin(Duration::from_millis(6));
        assert!(matches!(deadline.on_expiry(&limits), UpdateDeadline::Continue(n) if n <= 4));
        spin(Duration::from_millis(5));
        assert!(matches!(deadline.on_expiry(&limits), UpdateDeadline::Interrupt));
    }
}
