//! Files the host writes and maps back: the atomic write every upload and compiled
//! artifact goes through, and the mapping of a compiled artifact from the cache.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::types::PluginError;

/// Writes `dir/file` so that readers see the old or the new content, never a mix:
/// a hidden temp file in the same directory, fsync, rename, fsync the directory.
pub(super) fn write_atomically(dir: &Path, file: &str, bytes: &[u8]) -> Result<(), PluginError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir).map_err(|e| PluginError::io(dir, e))?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{file}.{}.{n}.tmp", std::process::id()));
    let target = dir.join(file);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        PluginError::io(&target, e)
    })
}

/// Maps a compiled artifact from the cache.
#[allow(unsafe_code)]
pub(super) fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file is native code, trusted as such. It is only ever written by
    // Herald (this module, or the `herald plugin compile` child it started) into the
    // cache directory, which the registry refuses to place inside the plugins
    // directory that uploads and operators write to; wasmtime checks that it was
    // compiled for this engine's configuration. Files are written whole and renamed
    // into place, never modified afterwards, so the mapping does not change under us.
    unsafe { Component::deserialize_file(engine, path) }
}
