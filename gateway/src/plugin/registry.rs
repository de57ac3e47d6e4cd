//! The per-tenant plugin registry: which version of `<dir>/<tenant>/<name>.wasm`
//! serves calls, hot reload from a `notify` watcher, and validated atomic upload.
//!
//! Architecture invariant: a call looks a plugin up by (tenant, name) only, so a
//! tenant can never reach another tenant's plugin; a swap replaces an `Arc`, so calls
//! in flight finish on the version they started with; a file that fails to load never
//! replaces a serving version.
//!
//! Loading never blocks the caller of [`PluginHost::start`]: it registers every file as
//! `loading` and a background thread loads them (cached artifacts first, tenants in
//! turn), so a restart serves at once and a tenant's plugin waits behind no other
//! tenant's compiles. Deliveries bound to a loading plugin wait (see
//! [`PluginHost::loading`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::pool::CallPool;
use super::runtime::{LoadedPlugin, Runtime};
use super::types::{
    Hook, HookSet, PluginConfig, PluginError, PluginFailure, PluginInfo, PluginMetrics, check_slug, is_slug,
    split_pinned,
};
use super::{DeliveryContext, Header, Outcome, Request, TransformResult, Verdict};
use files::read_dir;

mod files;
mod settings;
mod stats;
mod usage;
mod versions;
use super::artifacts::write_atomically;
use super::sandbox::LogCapture;
use stats::{Call, Stats};
pub use stats::{FailureRecord, PluginStats, RECENT_FAILURES};
pub use versions::{MAX_VERSIONS, PluginVersion};

/// The plugin host: a registry of tenants' plugins and the sandbox that runs them.
/// Cheap to clone; every clone shares one registry and one engine.
///
/// Hook calls are `async`: each runs on the host's call pool (dedicated threads, a fair
/// turn per tenant, see `pool`), never on the caller's thread, and always ends with an
/// output or a [`PluginFailure`]. Loading, installing and reloading compile code and
/// belong on a blocking thread (`install` does that itself).
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost").field("dir", &self.inner.config.dir).finish_non_exhaustive()
    }
}

struct Inner {
    runtime: Arc<Runtime>,
    pool: CallPool,
    config: PluginConfig,
    tenants: RwLock<HashMap<String, HashMap<String, Slot>>>,
    /// Tenants' own settings, by (tenant, plugin): between the operator's defaults and
    /// overrides. Kept apart from `tenants`, so they outlive a plugin's file. Lock order:
    /// `tenants` before this.
    tenant_config: RwLock<HashMap<(String, String), HashMap<String, String>>>,
    /// Held from a tenant-limit check to the write it allows and the swap that follows,
    /// so that two concurrent uploads cannot both fit in the last place, and so that a
    /// reload of an older read of the file never swaps in over a newer upload (the
    /// watcher checks the file again under it).
    installing: Mutex<()>,
    failures_by_kind: [AtomicU64; PluginFailure::KINDS.len()],
    /// Signalled whenever a load ends, for deliveries waiting on a loading plugin.
    loads_ended: tokio::sync::Notify,
    /// Kept only to stop watching when the host is dropped.
    _watcher: Mutex<Option<notify::RecommendedWatcher>>,
}

/// One (tenant, name): the serving version, the last load error, and counters that
/// survive reloads.
struct Slot {
    current: Option<Arc<LoadedPlugin>>,
    error: Option<String>,
    /// A file with no serving version yet is being loaded.
    loading: bool,
    /// The content of the file that last failed to load, so that the same bytes are
    /// neither loaded nor logged again until the file changes.
    failed: Option<Failed>,
    stats: Arc<Stats>,
}

impl Slot {
    fn new() -> Slot {
        Slot { current: None, error: None, loading: false, failed: None, stats: Arc::default() }
    }
}

/// A file's content that failed to load. Bad bytes (a client error) stay bad: they are
/// not tried again. Any other failure (I/O, the engine) is tried again, backing off.
struct Failed {
    sha256: String,
    /// When to try again, for a failure that is not the bytes' fault.
    retry_at: Option<Instant>,
    /// Failed tries of this content, for the backoff.
    tries: u32,
}

impl PluginHost {
    /// Builds the engine, registers every `<dir>/<tenant>/<name>.wasm` as loading and
    /// loads them on a background thread (a file that fails to load is recorded with
    /// its error, not fatal), starts the idle-instance sweeper and, when
    /// `config.watch`, the hot-reload watcher. Returns without compiling anything;
    /// [`PluginHost::wait_loaded`] waits for the initial load.
    pub fn start(mut config: PluginConfig) -> Result<PluginHost, PluginError> {
        std::fs::create_dir_all(&config.dir).map_err(|e| PluginError::io(&config.dir, e))?;
        // Watcher events carry absolute, symlink-free paths: match them.
        config.dir = std::fs::canonicalize(&config.dir).map_err(|e| PluginError::io(&config.dir, e))?;
        if let Some(cache) = &config.cache_dir {
            std::fs::create_dir_all(cache).map_err(|e| PluginError::io(cache, e))?;
            let cache = std::fs::canonicalize(cache).map_err(|e| PluginError::io(cache, e))?;
            // Artifacts are loaded as native code: never from where plugins are dropped.
            if cache.starts_with(&config.dir) || config.dir.starts_with(&cache) {
                return Err(PluginError::Engine(format!(
                    "the compile cache {} must be outside the plugins directory {}",
                    cache.display(),
                    config.dir.display()
                )));
            }
            config.cache_dir = Some(cache);
        }
        let runtime = Runtime::new(&config)?;
        let pool = CallPool::new(config.call_threads())?;
        let inner = Arc::new(Inner {
            runtime,
            pool,
            config,
            tenants: RwLock::new(HashMap::new()),
            tenant_config: RwLock::new(HashMap::new()),
            installing: Mutex::new(()),
            failures_by_kind: Default::default(),
            loads_ended: tokio::sync::Notify::new(),
            _watcher: Mutex::new(None),
        });
        let host = PluginHost { inner };
        let files = host.register_files()?;
        host.start_loader(files)?;
        host.start_sweeper();
        if host.inner.config.watch {
            host.start_watcher();
        }
        Ok(host)
    }

    /// Whether `tenant`'s plugin `name` has a file that is still being loaded, with no
    /// version serving yet: calls would fail `not_found`, so deliveries should wait.
    pub fn loading(&self, tenant: &str, name: &str) -> bool {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        tenants.get(tenant).and_then(|p| p.get(name)).is_some_and(|slot| slot.loading && slot.current.is_none())
    }

    /// Waits until `tenant`'s plugin `name` is no longer [`loading`](Self::loading), for
    /// at most `timeout`; returns whether it has finished (serving or failed).
    pub async fn until_loaded(&self, tenant: &str, name: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ended = self.inner.loads_ended.notified();
            tokio::pin!(ended);
            // Registered before the check, so a load ending in between is not missed.
            ended.as_mut().enable();
            if !self.loading(tenant, name) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }

    /// Waits until no plugin is loading, for at most `timeout`; returns whether none is.
    pub fn wait_loaded(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let any = {
                let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
                tenants.values().flat_map(|p| p.values()).any(|slot| slot.loading)
            };
            if !any {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the epoch ticker sleeps (no call for a while).
    #[cfg(test)]
    pub(crate) fn ticker_sleeping(&self) -> bool {
        self.inner.runtime.ticker_sleeping()
    }

    /// Warm instances kept over all plugins (each holds an instance slot).
    pub fn warm_instances(&self) -> usize {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        tenants.values().flat_map(|p| p.values()).filter_map(|s| s.current.as_ref()).map(|p| p.warm_count()).sum()
    }

    /// Calls `transform` of `tenant`'s plugin `name`.
    pub async fn transform(
        &self,
        tenant: &str,
        name: &str,
        ctx: &DeliveryContext,
        request: &Request,
    ) -> Result<TransformResult, PluginFailure> {
        let (c, request) = (ctx.clone(), request.clone());
        let call = move |p: &LoadedPlugin, logs: &mut LogCapture| p.transform(&c, &request, Some(logs));
        self.with_plugin((tenant, name, ctx), Hook::Transform, |_| None, call).await
    }

    /// Calls `classify` of `tenant`'s plugin `name`. `Ok(Verdict::Default)` and any
    /// `Err` both mean: use the built-in table.
    pub async fn classify(
        &self,
        tenant: &str,
        name: &str,
        ctx: &DeliveryContext,
        outcome: &Outcome,
    ) -> Result<Verdict, PluginFailure> {
        let unwanted = |p: &LoadedPlugin| (p.hooks.classify && !p.wants(outcome)).then_some(Verdict::Default);
        let (c, outcome) = (ctx.clone(), outcome.clone());
        let call = move |p: &LoadedPlugin, logs: &mut LogCapture| p.classify(&c, &outcome, Some(logs));
        self.with_plugin((tenant, name, ctx), Hook::Classify, unwanted, call).await
    }

    /// Calls `sign` of `tenant`'s plugin `name` with the raw bytes of each valid
    /// secret (newest first); returns the headers to set.
    pub async fn sign(
        &self,
        tenant: &str,
        name: &str,
        ctx: &DeliveryContext,
        secrets: &[Vec<u8>],
        request: &Request,
    ) -> Result<Vec<Header>, PluginFailure> {
        let (c, secrets, request) = (ctx.clone(), secrets.to_vec(), request.clone());
        let call = move |p: &LoadedPlugin, logs: &mut LogCapture| p.sign(&c, &secrets, &request, Some(logs));
        self.with_plugin((tenant, name, ctx), Hook::Sign, |_| None, call).await
    }

    /// The hooks of `tenant`'s plugin `name`, if a version of it is serving.
    pub fn get(&self, tenant: &str, name: &str) -> Option<HookSet> {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        tenants.get(tenant)?.get(name)?.current.as_ref().map(|p| p.hooks)
    }

    /// Every plugin of `tenant`, serving or broken, sorted by name (pinned versions
    /// loaded as `name@n` are not plugins of their own).
    pub fn list(&self, tenant: &str) -> Vec<PluginInfo> {
        let mut list: Vec<PluginInfo> = {
            let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
            let plugins = tenants.get(tenant).into_iter().flatten();
            plugins.filter(|(name, _)| !name.contains('@')).map(|(name, slot)| info(tenant, name, slot)).collect()
        };
        list.sort_by(|a, b| a.name.cmp(&b.name));
        for p in &mut list {
            p.version = self.current_version(tenant, &p.name);
        }
        list
    }

    /// [`PluginHost::install_keeping`] with no pinned version to keep.
    pub async fn install(&self, tenant: &str, name: &str, bytes: Vec<u8>) -> Result<PluginInfo, PluginError> {
        self.install_keeping(tenant, name, bytes, Vec::new()).await
    }

    /// Validates `bytes` (the tenant's limits, size, structure, compiles, right world,
    /// `describe` works and declares a hook), records them as a new version, writes
    /// `<dir>/<tenant>/<name>.wasm` atomically (temp file + fsync + rename) and starts
    /// serving it. The watcher then sees a file it already has.
    ///
    /// Old versions go past [`MAX_VERSIONS`], or as far as the tenant's
    /// `max_tenant_bytes` needs room (stored versions count toward it; see `usage`),
    /// oldest first; never one of `pinned`, the versions of `name` that endpoints bind as
    /// `name@n` (the caller knows the endpoints).
    pub async fn install_keeping(
        &self,
        tenant: &str,
        name: &str,
        bytes: Vec<u8>,
        pinned: Vec<u32>,
    ) -> Result<PluginInfo, PluginError> {
        let host = self.clone();
        let (tenant, name) = (tenant.to_string(), name.to_string());
        tokio::task::spawn_blocking(move || host.install_bytes(&tenant, &name, &bytes, Some(&pinned)))
            .await
            .map_err(|e| PluginError::Engine(format!("install task failed: {e}")))?
    }

    /// [`PluginHost::install`] on the current thread (compiles: keep it off the async
    /// runtime).
    pub fn install_blocking(&self, tenant: &str, name: &str, bytes: &[u8]) -> Result<PluginInfo, PluginError> {
        self.install_bytes(tenant, name, bytes, Some(&[]))
    }

    /// Validates and serves `bytes` as `name`; with `record` (the pinned versions to
    /// keep), keeps them as a new version first (an upload; a rollback serves a version
    /// it already has).
    fn install_bytes(
        &self,
        tenant: &str,
        name: &str,
        bytes: &[u8],
        record: Option<&[u32]>,
    ) -> Result<PluginInfo, PluginError> {
        check_slug("tenant", tenant)?;
        check_slug("plugin name", name)?;
        self.check_size(tenant, bytes.len())?;
        let sha256 = hex::encode(Sha256::digest(bytes));
        let incoming = usage::Incoming { sha256: &sha256, size: bytes.len(), record };
        self.plan_storage(tenant, name, &incoming)?;
        let plugin = self.inner.runtime.load(tenant, name, bytes, self.plugin_config(tenant, name))?;
        let dir = self.inner.config.dir.join(tenant);
        let installing = self.inner.installing.lock().unwrap_or_else(|e| e.into_inner());
        let prune = self.plan_storage(tenant, name, &incoming)?;
        if record.is_some() {
            self.record_version(tenant, name, (&plugin.sha256, bytes), false)?;
        }
        write_atomically(&dir, &format!("{name}.wasm"), bytes)?;
        for old in prune {
            let _ = std::fs::remove_file(old);
        }
        tracing::info!(tenant, plugin = name, sha256 = %plugin.sha256, hooks = %plugin.hooks, "plugin installed");
        self.swap(tenant, name, Ok(plugin));
        drop(installing);
        let mut info = {
            let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
            info(tenant, name, &tenants[tenant][name])
        };
        info.version = self.current_version(tenant, name);
        Ok(info)
    }

    /// Call and failure counters of every hook of every plugin.
    pub fn metrics(&self) -> Vec<PluginMetrics> {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (tenant, plugins) in tenants.iter() {
            for (name, slot) in plugins {
                for hook in Hook::ALL {
                    let calls = slot.stats.calls[hook.index()].load(Ordering::Relaxed);
                    if calls > 0 {
                        out.push(PluginMetrics {
                            tenant: tenant.clone(),
                            name: name.clone(),
                            hook,
                            calls,
                            failures: slot.stats.failures[hook.index()].load(Ordering::Relaxed),
                        });
                    }
                }
            }
        }
        out
    }

    /// Failures since start, by [`PluginFailure::kind`].
    pub fn failures_by_kind(&self) -> Vec<(&'static str, u64)> {
        PluginFailure::KINDS
            .iter()
            .zip(&self.inner.failures_by_kind)
            .map(|(k, n)| (*k, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Refuses a plugin of `size` bytes over `tenant`'s `max_plugin_bytes`.
    pub(super) fn check_size(&self, tenant: &str, size: usize) -> Result<(), PluginError> {
        let (limit, key) = self.upload_limit(tenant);
        if size > limit {
            return Err(PluginError::TooLarge { size, limit, key });
        }
        Ok(())
    }

    /// The largest plugin `tenant` may upload (its own limit, else the global one), and
    /// the config key that sets it, for the error that refuses a larger one.
    pub fn upload_limit(&self, tenant: &str) -> (usize, String) {
        let limit = self.inner.runtime.limits_of(tenant).max_plugin_bytes;
        (limit, self.inner.config.limit_key(tenant, "max_plugin_bytes"))
    }

    /// Looks the plugin up, answers at once when `inline` can (no guest code runs), else
    /// runs `call` on the call pool (its log lines captured); counts the call, times it
    /// and records any failure with the call's log lines.
    async fn with_plugin<R: Send + 'static>(
        &self,
        (tenant, name, ctx): (&str, &str, &DeliveryContext),
        hook: Hook,
        inline: impl FnOnce(&LoadedPlugin) -> Option<R>,
        call: impl FnOnce(&LoadedPlugin, &mut LogCapture) -> Result<R, PluginFailure> + Send + 'static,
    ) -> Result<R, PluginFailure> {
        if split_pinned(name).is_some() {
            self.ensure_pinned(tenant, name).await;
        }
        let found = {
            let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
            tenants
                .get(tenant)
                .and_then(|plugins| plugins.get(name))
                .map(|slot| (slot.current.clone(), Arc::clone(&slot.stats)))
        };
        let started = Instant::now();
        let (result, logs) = match &found {
            Some((Some(plugin), stats)) => {
                stats.calls[hook.index()].fetch_add(1, Ordering::Relaxed);
                match inline(plugin) {
                    Some(answer) => (Ok(answer), Vec::new()),
                    None => {
                        let owner = Arc::clone(&plugin.tenant);
                        let plugin = Arc::clone(plugin);
                        let run = move || {
                            let mut logs = Vec::new();
                            Ok((call(&plugin, &mut logs), logs))
                        };
                        match self.inner.pool.run(&owner, run).await {
                            Ok((result, logs)) => (result, logs),
                            Err(failure) => (Err(failure), Vec::new()),
                        }
                    }
                }
            }
            _ => (Err(PluginFailure::NotFound), Vec::new()),
        };
        let failure = result.as_ref().err();
        if let Some(failure) = failure {
            self.inner.failures_by_kind[failure.kind_index()].fetch_add(1, Ordering::Relaxed);
            tracing::debug!(tenant, plugin = name, hook = hook.as_str(), reason = %failure, "plugin call failed");
        }
        if let Some((_, stats)) = &found {
            if failure.is_some() {
                stats.failures[hook.index()].fetch_add(1, Ordering::Relaxed);
            }
            let call = Call { hook, took: started.elapsed(), event_id: &ctx.event_id, attempt_id: &ctx.attempt_id };
            stats.record(call, failure, logs);
        }
        result
    }

    fn serving_sha256(&self, tenant: &str, name: &str) -> Option<String> {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        let slot = tenants.get(tenant)?.get(name)?;
        slot.current.as_ref().map(|p| p.sha256.clone())
    }

    fn mark_loading(&self, tenant: &str, name: &str) {
        let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
        tenants.entry(tenant.to_string()).or_default().entry(name.to_string()).or_insert_with(Slot::new).loading = true;
    }

    /// Ends a load: the new version serves, or the error (if any) is recorded and the
    /// previous version keeps serving.
    fn swap(&self, tenant: &str, name: &str, loaded: Result<Arc<LoadedPlugin>, Option<String>>) {
        let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
        let plugins = tenants.entry(tenant.to_string()).or_default();
        // A load that ends without a plugin never creates a slot: a delete that removed it
        // while the load ran stays done.
        if loaded.is_err() && !plugins.contains_key(name) {
            drop(tenants);
            self.inner.loads_ended.notify_waiters();
            return;
        }
        let slot = plugins.entry(name.to_string()).or_insert_with(Slot::new);
        slot.loading = false;
        match loaded {
            Ok(plugin) => {
                // Loaded with the settings of when the load began: settings changed since
                // then apply to it before it serves.
                let config = self.plugin_config(tenant, name);
                let plugin = if *plugin.config() == config { plugin } else { Arc::new(plugin.with_config(config)) };
                slot.current = Some(plugin);
                slot.error = None;
                slot.failed = None;
            }
            Err(error) => slot.error = error.or(slot.error.take()),
        }
        drop(tenants);
        self.inner.loads_ended.notify_waiters();
    }
}

fn info(tenant: &str, name: &str, slot: &Slot) -> PluginInfo {
    let current = slot.current.as_deref();
    PluginInfo {
        tenant: tenant.to_string(),
        name: name.to_string(),
        hooks: current.map(|p| p.hooks).unwrap_or_default(),
        sha256: current.map(|p| p.sha256.clone()).unwrap_or_default(),
        size: current.map(|p| p.size).unwrap_or(0),
        plugin_name: current.map(|p| p.plugin_name.clone()).unwrap_or_default(),
        plugin_version: current.map(|p| p.plugin_version.clone()).unwrap_or_default(),
        classify_statuses: current.and_then(|p| p.classify_statuses.clone()),
        loaded_at: current.map(|p| p.loaded_at),
        load_time: current.map(|p| p.load_time),
        loading: slot.loading,
        error: slot.error.clone(),
        version: None,
    }
}
