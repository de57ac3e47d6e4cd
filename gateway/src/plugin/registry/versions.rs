//! Every upload kept as a numbered version: `<dir>/<tenant>/.versions/<name>/<n>.<sha256>.<kind>`
//! beside the serving file `<dir>/<tenant>/<name>.<kind>` that the watcher hot-reloads.
//! The watcher never looks inside `.versions` (its paths are one level deeper than a
//! plugin's), so a version is served only when it is copied to the serving file (an
//! upload, a rollback) or bound pinned, as `name@n`, which loads it under that name.
//! The file's kind (`wasm`) is kept as its extension, so another artifact kind fits.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::*;

/// Versions kept per plugin; older ones are deleted at the next upload, except those an
/// endpoint pins (see [`PluginHost::install_keeping`]).
pub const MAX_VERSIONS: usize = 20;

/// One stored version of a plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginVersion {
    /// 1 for the first upload, then one more per upload of different bytes.
    pub number: u32,
    pub sha256: String,
    pub size: u64,
    /// When it was uploaded.
    pub created_at: Option<SystemTime>,
    /// It is what serves `name` (the newest version with the serving bytes).
    pub current: bool,
}

pub(super) struct VersionFile {
    pub(super) number: u32,
    pub(super) sha256: String,
    pub(super) path: PathBuf,
}

impl PluginHost {
    pub(super) fn versions_dir(&self, tenant: &str, name: &str) -> PathBuf {
        self.inner.config.dir.join(tenant).join(".versions").join(name)
    }

    pub(super) fn version_files(&self, tenant: &str, name: &str) -> Vec<VersionFile> {
        let mut files: Vec<VersionFile> = read_dir(&self.versions_dir(tenant, name))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|path| {
                let file = path.file_name()?.to_str()?;
                let mut parts = file.splitn(3, '.');
                let number = parts.next()?.parse().ok()?;
                let sha256 = parts.next()?.to_string();
                parts.next()?;
                Some(VersionFile { number, sha256, path })
            })
            .collect();
        files.sort_by_key(|f| f.number);
        files
    }

    /// Records `bytes` as the next version of (tenant, name), unless the newest version
    /// has the same bytes, or, when `reloaded` (bytes loaded from the serving file by a hot
    /// reload or a restart), any stored version has them (a rollback or an upload wrote
    /// that file). Returns its number. Which old versions an upload lets go is decided
    /// with the tenant's limits (see `plan_storage`); a reload deletes none (pinned ones
    /// are known to the API, not here), the next upload prunes.
    pub(super) fn record_version(
        &self,
        tenant: &str,
        name: &str,
        (sha256, bytes): (&str, &[u8]),
        reloaded: bool,
    ) -> Result<u32, PluginError> {
        let files = self.version_files(tenant, name);
        let stored = match reloaded {
            true => files.iter().rev().find(|f| f.sha256 == sha256),
            false => files.last().filter(|f| f.sha256 == sha256),
        };
        if let Some(stored) = stored {
            return Ok(stored.number);
        }
        let number = files.last().map_or(1, |f| f.number + 1);
        write_atomically(&self.versions_dir(tenant, name), &format!("{number}.{sha256}.wasm"), bytes)?;
        Ok(number)
    }

    /// The versions of `tenant`'s plugin `name`, oldest first.
    pub fn versions(&self, tenant: &str, name: &str) -> Vec<PluginVersion> {
        let serving = self.serving_sha256(tenant, name);
        let files = self.version_files(tenant, name);
        let current = files.iter().rev().find(|f| Some(&f.sha256) == serving.as_ref()).map(|f| f.number);
        files
            .iter()
            .map(|f| {
                let meta = std::fs::metadata(&f.path).ok();
                PluginVersion {
                    number: f.number,
                    sha256: f.sha256.clone(),
                    size: meta.as_ref().map_or(0, |m| m.len()),
                    created_at: meta.and_then(|m| m.modified().ok()),
                    current: current == Some(f.number),
                }
            })
            .collect()
    }

    /// The number of the version serving `name`, if it is a recorded one.
    pub(super) fn current_version(&self, tenant: &str, name: &str) -> Option<u32> {
        self.versions(tenant, name).into_iter().find(|v| v.current).map(|v| v.number)
    }

    fn version_bytes(&self, tenant: &str, name: &str, number: u32) -> Result<Vec<u8>, PluginError> {
        let file = self.version_files(tenant, name).into_iter().find(|f| f.number == number);
        let file = file.ok_or_else(|| PluginError::NoSuchVersion { name: name.to_string(), version: number })?;
        std::fs::read(&file.path).map_err(|e| PluginError::io(&file.path, e))
    }

    /// Serves version `number` as `name` again (validated like an upload, written
    /// atomically): calls in flight finish on the version they started with, later ones
    /// use this one. Records no new version.
    pub async fn rollback(&self, tenant: &str, name: &str, number: u32) -> Result<PluginInfo, PluginError> {
        let host = self.clone();
        let (tenant, name) = (tenant.to_string(), name.to_string());
        tokio::task::spawn_blocking(move || {
            let bytes = host.version_bytes(&tenant, &name, number)?;
            host.install_bytes(&tenant, &name, &bytes, None)
        })
        .await
        .map_err(|e| PluginError::Engine(format!("rollback task failed: {e}")))?
    }

    /// Makes sure a pinned `name@n` of `tenant` is loaded (from its version file, under
    /// that name), off the async runtime. Returns whether it serves.
    pub async fn ensure_pinned(&self, tenant: &str, pinned: &str) -> bool {
        let Some((name, number)) = split_pinned(pinned) else { return false };
        if self.get(tenant, pinned).is_some() {
            return true;
        }
        let host = self.clone();
        let (tenant, name, pinned) = (tenant.to_string(), name.to_string(), pinned.to_string());
        let loaded = tokio::task::spawn_blocking(move || {
            let bytes = host.version_bytes(&tenant, &name, number)?;
            let config = host.plugin_config(&tenant, &pinned);
            let plugin = host.inner.runtime.load(&tenant, &pinned, &bytes, config)?;
            host.swap(&tenant, &pinned, Ok(plugin));
            Ok::<_, PluginError>(())
        })
        .await;
        matches!(loaded, Ok(Ok(())))
    }

    /// Deletes `tenant`'s plugin `name`: its serving file, its versions and whatever
    /// serves it (pinned versions too). The caller checks that no endpoint binds it.
    /// False when there is no such plugin.
    pub fn delete(&self, tenant: &str, name: &str) -> Result<bool, PluginError> {
        // Under the install lock, so a reload that read the file before it went cannot
        // serve it again after.
        let _installing = self.inner.installing.lock().unwrap_or_else(|e| e.into_inner());
        let dir = self.inner.config.dir.join(tenant);
        let file = dir.join(format!("{name}.wasm"));
        let existed = self.list(tenant).iter().any(|p| p.name == name);
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(PluginError::io(&file, e)),
        }
        let versions = self.versions_dir(tenant, name);
        if versions.exists() {
            std::fs::remove_dir_all(&versions).map_err(|e| PluginError::io(&versions, e))?;
        }
        sync_dir(&dir);
        let mut tenants = self.inner.tenants.write().unwrap_or_else(|e| e.into_inner());
        if let Some(plugins) = tenants.get_mut(tenant) {
            plugins.retain(|key, _| key != name && split_pinned(key).is_none_or(|(base, _)| base != name));
        }
        tracing::info!(tenant, plugin = name, "plugin deleted");
        Ok(existed)
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
