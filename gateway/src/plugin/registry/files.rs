//! The registry's side that faces the directory: registering and loading the files at
//! start (in the background), reloading one when it changes, the watcher that notices,
//! the idle-instance sweeper, and the atomic write of an upload.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use notify::Watcher as _;

use super::*;

impl PluginHost {
    /// Re-reads every plugin file under the directory (what the watcher does for one
    /// file, for all of them). Blocking.
    pub fn rescan(&self) -> Result<(), PluginError> {
        let seen = self.plugin_files()?;
        for (tenant, name) in &seen {
            self.reload(tenant, name);
        }
        self.forget_all_but(&seen);
        Ok(())
    }

    /// Every `(tenant, name)` with a plugin file on disk.
    pub(super) fn plugin_files(&self) -> Result<Vec<(String, String)>, PluginError> {
        let mut files = Vec::new();
        for tenant_dir in read_dir(&self.inner.config.dir)? {
            if tenant_dir.is_dir() {
                files.extend(read_dir(&tenant_dir)?.iter().filter_map(|f| self.parse_path(f)));
            }
        }
        Ok(files)
    }

    pub(super) fn forget_all_but(&self, seen: &[(String, String)]) {
        let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
        for (tenant, plugins) in tenants.iter_mut() {
            plugins.retain(|name, _| seen.iter().any(|(t, n)| t == tenant && n == name));
        }
    }

    /// Registers every plugin file as loading, and returns them in load order: by name,
    /// tenants taking turns, so one tenant's many plugins cannot delay another's.
    pub(super) fn register_files(&self) -> Result<Vec<(String, String)>, PluginError> {
        let mut files = self.plugin_files()?;
        files.sort();
        let mut by_tenant: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        {
            let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
            for (tenant, name) in &files {
                let slots = tenants.entry(tenant.clone()).or_default();
                slots.entry(name.clone()).or_insert_with(Slot::new).loading = true;
                by_tenant.entry(tenant).or_default().push(name);
            }
        }
        let rounds = by_tenant.values().map(Vec::len).max().unwrap_or(0);
        Ok((0..rounds)
            .flat_map(|i| {
                by_tenant.iter().filter_map(move |(t, names)| names.get(i).map(|n| (t.to_string(), n.to_string())))
            })
            .collect())
    }

    /// Loads `files` on a thread of its own. Two passes: what the compile cache holds
    /// (milliseconds each) before anything that must be compiled.
    pub(super) fn start_loader(&self, files: Vec<(String, String)>) -> Result<(), PluginError> {
        let host = self.clone();
        std::thread::Builder::new()
            .name("herald-plugin-load".into())
            .spawn(move || {
                let (cached, uncached): (Vec<_>, Vec<_>) =
                    files.into_iter().partition(|(tenant, name)| host.is_cached(tenant, name));
                for (tenant, name) in cached.iter().chain(&uncached) {
                    host.reload(tenant, name);
                }
                tracing::info!(plugins = cached.len() + uncached.len(), compiled = uncached.len(), "plugins loaded");
            })
            .map(|_| ())
            .map_err(|e| PluginError::Engine(format!("cannot start the plugin loader thread: {e}")))
    }

    pub(super) fn is_cached(&self, tenant: &str, name: &str) -> bool {
        let path = self.inner.config.dir.join(tenant).join(format!("{name}.wasm"));
        std::fs::read(path).is_ok_and(|bytes| self.inner.runtime.is_cached(&bytes))
    }

    /// Drops warm instances idle for `warm_idle`, on a thread that ends with the host.
    pub(super) fn start_sweeper(&self) {
        let weak = Arc::downgrade(&self.inner);
        let idle = self.inner.config.warm_idle;
        let every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let spawned = std::thread::Builder::new().name("herald-plugin-sweep".into()).spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(inner) = weak.upgrade() else { return };
                let Some(cutoff) = Instant::now().checked_sub(idle) else { continue };
                let plugins: Vec<Arc<LoadedPlugin>> = {
                    let tenants = inner.tenants.read().unwrap_or_else(|e| e.into_inner());
                    tenants.values().flat_map(|p| p.values()).filter_map(|s| s.current.clone()).collect()
                };
                plugins.iter().for_each(|p| p.drop_idle(cutoff));
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the plugin sweeper thread; idle instances are kept");
        }
    }

    /// Loads the file of (tenant, name) if its content changed: swaps it in, or keeps
    /// the old version and records the error; forgets the plugin if the file is gone.
    /// Content that failed to load is logged once and not loaded again: returns when to
    /// try again, if ever (a failure that is not the bytes' fault, backing off).
    pub(super) fn reload(&self, tenant: &str, name: &str) -> Option<Duration> {
        let path = self.inner.config.dir.join(tenant).join(format!("{name}.wasm"));
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
                if let Some(plugins) = tenants.get_mut(tenant)
                    && plugins.remove(name).is_some()
                {
                    tracing::info!(tenant, plugin = name, "plugin removed");
                }
                return None;
            }
            Err(e) => {
                // Read again when it changes (a chmod is an event too).
                self.swap(tenant, name, Err(Some(format!("cannot read {}: {e}", path.display()))));
                return None;
            }
        };
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if let Some(wait) = self.failed_before(tenant, name, &sha256) {
            return wait;
        }
        match self.serving_sha256(tenant, name) {
            Some(serving) if serving == sha256 => {
                self.swap(tenant, name, Err(None));
                return None;
            }
            Some(_) => {}
            // Nothing serves it yet: its deliveries wait for this load.
            None => self.mark_loading(tenant, name),
        }
        let loaded = self
            .check_size(tenant, bytes.len())
            .and_then(|()| self.inner.runtime.load(tenant, name, &bytes, self.plugin_config(tenant, name)));
        match loaded {
            Ok(plugin) => {
                // An upload or rollback may have replaced the file since it was read: then
                // its own swap stands, and the watcher reloads the newer file anyway.
                let _installing = self.inner.installing.lock().unwrap_or_else(|e| e.into_inner());
                // A delete may have removed the file since: then nothing serves it.
                let now = match std::fs::read(&path) {
                    Ok(b) => hex::encode(Sha256::digest(&b)),
                    Err(_) => {
                        self.swap(tenant, name, Err(None));
                        return None;
                    }
                };
                if now != plugin.sha256 {
                    self.swap(tenant, name, Err(None));
                    return None;
                }
                // A file dropped in or changed on disk is a version like an upload's, so
                // that `version` and `…/versions` say what serves (bytes already stored, as
                // after a rollback or at a restart, are that version again).
                let version = self.record_version(tenant, name, (&plugin.sha256, &bytes), true);
                let version = version.inspect_err(|e| {
                    tracing::warn!(tenant, plugin = name, error = %e, "cannot record the reloaded plugin as a version");
                });
                tracing::info!(tenant, plugin = name, sha256 = %plugin.sha256, hooks = %plugin.hooks, version = version.ok(), "plugin loaded");
                self.swap(tenant, name, Ok(plugin));
                None
            }
            Err(e) => {
                let (first, retry) = self.record_failure(tenant, name, sha256, e.is_client_error());
                if first {
                    tracing::warn!(tenant, plugin = name, error = %e, "plugin failed to load; the previous version keeps serving");
                } else {
                    tracing::debug!(tenant, plugin = name, error = %e, "plugin failed to load again");
                }
                self.swap(tenant, name, Err(Some(e.to_string())));
                retry
            }
        }
    }

    /// For content that failed to load before: `Some(None)` if it is not to be tried
    /// again, `Some(Some(wait))` if not yet; `None` to load it.
    fn failed_before(&self, tenant: &str, name: &str, sha256: &str) -> Option<Option<Duration>> {
        let tenants = self.inner.tenants.read().unwrap_or_else(|e| e.into_inner());
        let failed = tenants.get(tenant)?.get(name)?.failed.as_ref().filter(|f| f.sha256 == sha256)?;
        match failed.retry_at {
            None => Some(None),
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                (!wait.is_zero()).then_some(Some(wait))
            }
        }
    }

    /// Records that `sha256` failed to load; returns whether this is the first failure
    /// of that content (to be logged), and when to try it again, if ever.
    fn record_failure(&self, tenant: &str, name: &str, sha256: String, bytes_fault: bool) -> (bool, Option<Duration>) {
        let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
        // A delete that removed the slot meanwhile stays done (see `swap`).
        let Some(slot) = tenants.get_mut(tenant).and_then(|p| p.get_mut(name)) else { return (true, None) };
        let tries = match &slot.failed {
            Some(f) if f.sha256 == sha256 => f.tries + 1,
            _ => 1,
        };
        let retry = (!bytes_fault).then(|| retry_after(tries));
        slot.failed = Some(Failed { sha256, retry_at: retry.map(|wait| Instant::now() + wait), tries });
        (tries == 1, retry)
    }

    /// `<dir>/<tenant>/<name>.wasm` with slug tenant and name, else `None`.
    pub(super) fn parse_path(&self, path: &Path) -> Option<(String, String)> {
        let rel = path.strip_prefix(&self.inner.config.dir).ok()?;
        let mut parts = rel.components();
        let tenant = parts.next()?.as_os_str().to_str()?;
        let file = parts.next()?.as_os_str().to_str()?;
        if parts.next().is_some() {
            return None;
        }
        let name = file.strip_suffix(".wasm")?;
        (is_slug(tenant) && is_slug(name)).then(|| (tenant.to_string(), name.to_string()))
    }

    /// Watches the plugin directory; a debouncing thread reloads each changed file once
    /// it has been quiet for `reload_debounce`. Failure to watch is logged, not fatal:
    /// plugins then change only through `install` or `rescan`.
    pub(super) fn start_watcher(&self) {
        let (tx, rx) = mpsc::channel::<PathBuf>();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Opening or reading a file changes nothing, and the reload itself reads it:
            // reacting to that reloaded every file each `reload_debounce`, forever.
            if let Ok(event) = event
                && !event.kind.is_access()
            {
                for path in event.paths {
                    let _ = tx.send(path);
                }
            }
        });
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the plugin directory; hot reload is off");
                return;
            }
        };
        if let Err(e) = watcher.watch(&self.inner.config.dir, notify::RecursiveMode::Recursive) {
            tracing::warn!(error = %e, dir = %self.inner.config.dir.display(), "cannot watch the plugin directory; hot reload is off");
            return;
        }
        *self.inner._watcher.lock().unwrap_or_else(|e| e.into_inner()) = Some(watcher);
        let weak = Arc::downgrade(&self.inner);
        let debounce = self.inner.config.reload_debounce;
        let spawned = std::thread::Builder::new()
            .name("herald-plugin-watch".into())
            .spawn(move || debounce_loop(rx, weak, debounce));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the plugin watcher thread; hot reload is off");
        }
    }
}

/// Collects changed paths and reloads each once no event touched it for `debounce`.
/// Ends when the watcher (and so the sender) is dropped with the host.
/// The wait before the next try of content whose load failed `tries` times through no
/// fault of its bytes: 1 s, doubling, at most 5 minutes.
fn retry_after(tries: u32) -> Duration {
    Duration::from_secs(1u64 << tries.saturating_sub(1).min(8)).min(Duration::from_secs(300))
}

fn debounce_loop(rx: mpsc::Receiver<PathBuf>, host: Weak<Inner>, debounce: Duration) {
    let mut pending: HashMap<PathBuf, Instant> = HashMap::new();
    loop {
        let wait = pending.values().min().map(|due| due.saturating_duration_since(Instant::now()));
        let received = match wait {
            Some(wait) => rx.recv_timeout(wait),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(path) => {
                pending.insert(path, Instant::now() + debounce);
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        let due: Vec<PathBuf> = pending.iter().filter(|(_, at)| **at <= now).map(|(p, _)| p.clone()).collect();
        let Some(inner) = host.upgrade() else { return };
        let host = PluginHost { inner };
        for path in due {
            pending.remove(&path);
            // A new tenant directory: files written into it before the watcher added its
            // watch raised no event of their own, so load whatever it holds now.
            let paths = if path.is_dir() { read_dir(&path).unwrap_or_default() } else { vec![path] };
            for path in paths {
                if let Some((tenant, name)) = host.parse_path(&path)
                    && let Some(wait) = host.reload(&tenant, &name)
                {
                    pending.insert(path, Instant::now() + wait);
                }
            }
        }
    }
}

pub(super) fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, PluginError> {
    let entries = std::fs::read_dir(dir).map_err(|e| PluginError::io(dir, e))?;
    Ok(entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
}
