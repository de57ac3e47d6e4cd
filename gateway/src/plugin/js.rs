//! JavaScript plugins: a tenant's plugin may be JavaScript source instead of a
//! component. Herald runs every one of them on its one JavaScript runtime component
//! (`sdk-js/runtime.js`, world `herald:plugin/js-runtime` in `wit/js.wit`), compiled
//! once, cached and shared; the runtime reads the tenant's source through the
//! `js-source` import and evaluates it once per warm instance.
//!
//! Architecture invariant: the runtime is shared as compiled code only. Every tenant's
//! calls run on instances of that tenant's own `LoadedPlugin`, with the same deadline,
//! pool turn and output checks as a component plugin, and a memory cap of their own
//! (`js_memory_limit`, since the runtime's heap lives in the instance's memory). The
//! runtime file is operator-supplied code: it is never uploaded, never size- or
//! structure-checked like tenants' components, and compiled in this process.
//!
//! Why one shared runtime: a JavaScript component is ~12 MB and compiles to ~37 MB of
//! native code in seconds, far too much per tenant. Shared, a tenant's plugin costs one
//! instance: ~2.6 MiB of RSS per tenant with 100 tenants' plugins warm, a load (instance +
//! evaluation + `describe`) of ~4 ms p50, a transform of a 1 KiB event of ~140 µs p50
//! (`herald-bench js-tenants`, `js-calls`; debug build on a shared 2-core machine).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use super::bindings::PluginPre;
use super::output::root_message;
use super::sandbox::HostState;
use super::types::{PluginConfig, PluginError};

/// The WASM binary magic; what does not start with it is taken for JavaScript.
const WASM_MAGIC: &[u8] = b"\0asm";
/// The file name looked for beside the executable when `js_runtime` is unset.
const DEFAULT_FILE: &str = "herald-js.wasm";
/// The runtime's import of the tenant source.
const SOURCE_IMPORT: &str = "herald:plugin/js-source@0.1.0";

/// What a plugin file holds.
pub(crate) enum Source<'a> {
    /// A WebAssembly component.
    Component,
    /// JavaScript source for the runtime.
    Js(&'a str),
}

/// Tells a component from JavaScript source by content: the WASM magic, or else UTF-8
/// text (anything else is refused with a message that names both).
pub(crate) fn detect(bytes: &[u8]) -> Result<Source<'_>, PluginError> {
    if bytes.starts_with(WASM_MAGIC) {
        return Ok(Source::Component);
    }
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.trim().is_empty() => Ok(Source::Js(text)),
        Ok(_) => Err(PluginError::Invalid("the file is empty".into())),
        Err(e) => Err(PluginError::Invalid(format!(
            "no \\0asm magic, and not UTF-8 text either, so not JavaScript source ({e})"
        ))),
    }
}

/// What an upload that is not a component failed on as JavaScript, said so that an author
/// who meant to upload a component learns that too.
pub(crate) fn as_js_error(e: PluginError) -> PluginError {
    if e.is_client_error() { PluginError::Invalid(format!("no \\0asm magic, so read as JavaScript: {e}")) } else { e }
}

/// Links the `js-source` import: the source of the store's plugin (empty for a
/// component plugin, which never imports it).
pub(super) fn link_source(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.instance(SOURCE_IMPORT)?.func_wrap("source", |store, (): ()| {
        let state: &HostState = store.data();
        Ok((state.js_source.as_deref().unwrap_or_default().to_string(),))
    })?;
    Ok(())
}

/// The shared runtime: found, compiled (or mapped from the cache) and pre-instantiated
/// on the first JavaScript load, then reused by every tenant.
pub(crate) struct JsRuntime {
    path: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    engine_key: String,
    loaded: Mutex<Option<PluginPre<HostState>>>,
    /// Where its artifact may be, named by the runtime's SHA-256 (hashed once: 12 MB).
    artifacts: OnceLock<Vec<PathBuf>>,
}

impl JsRuntime {
    pub(crate) fn new(cfg: &PluginConfig, engine_key: String) -> JsRuntime {
        let beside_exe = || std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join(DEFAULT_FILE)));
        JsRuntime {
            path: cfg.js_runtime.clone().or_else(beside_exe),
            cache_dir: cfg.cache_dir.clone(),
            engine_key,
            loaded: Mutex::new(None),
            artifacts: OnceLock::new(),
        }
    }

    /// The pre-instantiated runtime, loading it on first use. Held under a lock, so two
    /// first uploads compile it once.
    pub(crate) fn pre(&self, engine: &Engine, linker: &Linker<HostState>) -> Result<PluginPre<HostState>, PluginError> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pre) = &*loaded {
            return Ok(pre.clone());
        }
        let path = self.path.as_deref().filter(|p| p.is_file()).ok_or_else(|| {
            let looked = self.path.as_deref().map_or("nowhere".into(), |p| p.display().to_string());
            PluginError::Rejected(format!(
                "JavaScript plugins are not available: no JavaScript runtime at {looked} (set plugins.js_runtime)"
            ))
        })?;
        let component = self.component(engine, path)?;
        let unusable = |e: wasmtime::Error| {
            PluginError::Engine(format!("the JavaScript runtime {} is unusable: {}", path.display(), root_message(&e)))
        };
        let pre = PluginPre::new(linker.instantiate_pre(&component).map_err(unusable)?).map_err(unusable)?;
        *loaded = Some(pre.clone());
        Ok(pre)
    }

    /// Whether a compiled artifact of the runtime is at hand (loading is then cheap).
    pub(crate) fn is_cached(&self) -> bool {
        let Some(path) = self.path.as_deref() else { return false };
        if self.artifacts.get().is_none() {
            let Ok(bytes) = std::fs::read(path) else { return false };
            self.artifact_paths(path, &bytes);
        }
        self.artifacts.get().is_some_and(|paths| paths.iter().any(|p| p.is_file()))
    }

    /// The compiled runtime: mapped from the cache directory or from beside the runtime
    /// file (where `herald plugin check` without a cache leaves it, so a build script
    /// can warm it), else compiled here and written to the first of those.
    fn component(&self, engine: &Engine, path: &Path) -> Result<Component, PluginError> {
        let bytes = std::fs::read(path).map_err(|e| PluginError::io(path, e))?;
        let candidates = self.artifact_paths(path, &bytes).clone();
        for artifact in candidates.iter().filter(|p| p.is_file()) {
            match super::compile::deserialize(engine, artifact) {
                Ok(component) => return Ok(component),
                Err(e) => {
                    tracing::warn!(path = %artifact.display(), error = %root_message(&e), "unusable compiled JavaScript runtime")
                }
            }
        }
        let started = std::time::Instant::now();
        let compiled = engine
            .precompile_component(&bytes)
            .map_err(|e| PluginError::Engine(format!("cannot compile {}: {}", path.display(), root_message(&e))))?;
        let target = &candidates[0];
        let (dir, file) = (target.parent().unwrap_or(Path::new(".")), target.file_name().unwrap_or_default());
        super::registry::write_atomically(dir, &file.to_string_lossy(), &compiled)?;
        tracing::info!(path = %target.display(), ms = started.elapsed().as_millis() as u64, "JavaScript runtime compiled");
        super::compile::deserialize(engine, target).map_err(|e| {
            PluginError::Engine(format!("compiled runtime {} unusable: {}", target.display(), root_message(&e)))
        })
    }

    /// The cache directory's artifact name, then the one beside the runtime file. The
    /// runtime file is operator-installed and read once, so its hash is kept.
    fn artifact_paths(&self, path: &Path, bytes: &[u8]) -> &Vec<PathBuf> {
        self.artifacts.get_or_init(|| {
            let file = format!("{}-{}.cwasm", hex::encode(Sha256::digest(bytes)), self.engine_key);
            let beside = path.parent().unwrap_or(Path::new(".")).join(format!("{DEFAULT_FILE}.{file}"));
            self.cache_dir.iter().map(|dir| dir.join(&file)).chain([beside]).collect()
        })
    }
}

/// The runtime of a `LoadedPlugin` that runs JavaScript: its source, handed to each of
/// its instances.
pub(crate) type JsSource = Option<Arc<str>>;
