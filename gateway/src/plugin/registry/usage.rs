//! What a tenant's plugins take on disk, checked against its limits before an upload or
//! a rollback is written, and which old versions an upload lets go.
//!
//! What counts toward `max_tenant_bytes`: every plugin's serving file and every kept
//! version, pinned ones included, each distinct content of a plugin once (the serving
//! file is normally a copy of one of its versions). Versions count because they are on
//! disk like the rest: without them a tenant could keep twenty times its limit.
//!
//! So that a tenant at its limit can still upload, an upload lets go of its plugin's
//! oldest versions first, as far as needed: never a pinned one, never the one it serves.
//! Past the newest [`MAX_VERSIONS`] the oldest unpinned ones go in any case (pinned ones
//! are kept beyond them). A rollback deletes
//! nothing (it serves bytes that are already stored).

use std::path::PathBuf;

use super::*;

/// What the refused byte total covers, as the limit error says it.
const WHAT_COUNTS: &str = "bytes of plugins (serving files and kept versions, pinned ones included)";

/// An upload's bytes, as `plan_storage` weighs them.
pub(super) struct Incoming<'a> {
    pub(super) sha256: &'a str,
    pub(super) size: usize,
    /// `Some(pinned)`: an upload, recorded as a new version; versions `pinned` (bound
    /// as `name@n`) are kept. `None`: a rollback to a stored version.
    pub(super) record: Option<&'a [u32]>,
}

impl PluginHost {
    /// Checks that serving `new` as (tenant, name) keeps the tenant within its plugin
    /// count and bytes, and returns the version files to delete once it is written.
    /// Counted from the files on disk, which include plugins still loading or broken.
    pub(super) fn plan_storage(
        &self,
        tenant: &str,
        name: &str,
        new: &Incoming<'_>,
    ) -> Result<Vec<PathBuf>, PluginError> {
        let config = &self.inner.config;
        let limits = self.inner.runtime.limits_of(tenant);
        let dir = config.dir.join(tenant);
        let serving: Vec<String> = read_dir(&dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|path| self.parse_path(path).map(|(_, n)| n))
            .filter(|n| n != name)
            .collect();
        let count = serving.len() + 1;
        if count > limits.max_plugins {
            return Err(self.over(tenant, "plugins", "max_plugins", count, limits.max_plugins));
        }
        // Other plugins, and leftover versions of plugins whose serving file is gone.
        let mut names: Vec<String> = read_dir(&dir.join(".versions"))
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .filter(|n| n != name && is_slug(n))
            .collect();
        names.extend(serving);
        names.sort();
        names.dedup();
        let others: usize = names.iter().map(|n| self.stored_bytes(tenant, n)).sum();

        let mut kept: Vec<(PathBuf, u32, usize)> = self
            .version_files(tenant, name)
            .into_iter()
            .map(|f| (size_of(&f.path), f))
            .map(|(s, f)| (f.path, f.number, s))
            .collect();
        let bytes = |kept: &[(PathBuf, u32, usize)]| kept.iter().map(|(_, _, size)| size).sum::<usize>();
        let Some(pinned) = new.record else {
            // A rollback: the serving file becomes a copy of a kept version.
            let total = others + bytes(&kept);
            return match total > limits.max_tenant_bytes {
                true => Err(self.over(tenant, WHAT_COUNTS, "max_tenant_bytes", total, limits.max_tenant_bytes)),
                false => Ok(Vec::new()),
            };
        };
        // A new version unless the newest has these bytes; the serving file is its copy.
        let adds = self.version_files(tenant, name).last().is_none_or(|f| f.sha256 != new.sha256);
        let added = if adds { new.size } else { 0 };
        let serving = if adds { None } else { kept.last().map(|(_, n, _)| *n) };
        let mut prune = Vec::new();
        // Oldest first, as far as the cap and then the bytes require.
        let mut i = 0;
        while i < kept.len() {
            // Pinned versions are kept beyond the newest MAX_VERSIONS.
            let unpinned = kept.iter().filter(|(_, n, _)| !pinned.contains(n)).count();
            let over_cap = unpinned + usize::from(adds) > MAX_VERSIONS;
            if !over_cap && others + bytes(&kept) + added <= limits.max_tenant_bytes {
                break;
            }
            let number = kept[i].1;
            if pinned.contains(&number) || serving == Some(number) {
                i += 1;
                continue;
            }
            prune.push(kept.remove(i).0);
        }
        let total = others + bytes(&kept) + added;
        if total > limits.max_tenant_bytes {
            return Err(self.over(tenant, WHAT_COUNTS, "max_tenant_bytes", total, limits.max_tenant_bytes));
        }
        Ok(prune)
    }

    /// Bytes of (tenant, name) on disk: its kept versions, and its serving file unless
    /// it is a copy of one of them (what serves it was loaded from such a copy).
    fn stored_bytes(&self, tenant: &str, name: &str) -> usize {
        let versions: Vec<(String, usize)> =
            self.version_files(tenant, name).into_iter().map(|f| (f.sha256, size_of(&f.path))).collect();
        let file = self.inner.config.dir.join(tenant).join(format!("{name}.wasm"));
        let serving = size_of(&file);
        let sha = self.serving_sha256(tenant, name);
        let copy = versions.iter().any(|(s, size)| Some(s) == sha.as_ref() && *size == serving);
        versions.iter().map(|(_, size)| size).sum::<usize>() + if copy { 0 } else { serving }
    }

    fn over(&self, tenant: &str, what: &'static str, field: &str, have: usize, limit: usize) -> PluginError {
        let key = self.inner.config.limit_key(tenant, field);
        PluginError::TenantLimit { tenant: tenant.to_string(), what, key, have, limit }
    }
}

fn size_of(path: &std::path::Path) -> usize {
    std::fs::metadata(path).map_or(0, |m| m.len() as usize)
}
