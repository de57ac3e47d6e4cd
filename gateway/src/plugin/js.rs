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
//! structure-checked like tenants' components, and compiled in this process. Where it
//! is, when `plugins.js_runtime` does not say, is looked up ([`JsRuntime::new`]); no error
//! a tenant can see names a path on the server (it is logged for the operator).
//!
//! The runtime checks what a hook returns (`sdk-js/plugin-host.js`) and ends a call whose
//! output its WIT type cannot hold, or whose source does not evaluate, through the
//! `js-failure` import with a message naming the field or the line: [`JsFailure`], which
//! the call's error carries to `output::failure_from`.
//!
//! Why one shared runtime: a JavaScript component is ~12 MB and compiles to ~37 MB of
//! native code in seconds, far too much per tenant. Shared, a tenant's plugin costs one
//! instance: ~2.6 MiB of RSS per tenant with 100 tenants' plugins warm, a load (instance +
//! evaluation + `describe`) of ~4 ms p50, a transform of a 1 KiB event of ~140 µs p50
//! (`herald-bench js-tenants`, `js-calls`; debug build on a shared 2-core machine).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use super::artifacts::{deserialize, write_atomically};
use super::bindings::PluginPre;
use super::output::{FailureKind, JsFailure, root_message};
use super::sandbox::HostState;
use super::types::{PluginConfig, PluginError, PluginFailure};

/// The WASM binary magic; what does not start with it is taken for JavaScript.
const WASM_MAGIC: &[u8] = b"\0asm";
/// The runtime's file name, looked for when `js_runtime` is unset.
const DEFAULT_FILE: &str = "herald-js.wasm";
/// Where `scripts/build-js-runtime` leaves it, under a cargo target directory.
const BUILD_DIR: &str = "js-runtime";
/// The runtime's import of the tenant source.
const SOURCE_IMPORT: &str = "herald:plugin/js-source@0.1.0";
/// The runtime's import that ends a failed call.
const FAILURE_IMPORT: &str = "herald:plugin/js-failure@0.1.0";

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

/// A JavaScript source's load-check error as its author reads it: what the runtime said
/// of the source (a syntax error and its line, a field of `describe`), not the wording
/// of a component's load check.
pub(crate) fn as_js_error(e: PluginError) -> PluginError {
    match e {
        PluginError::Rejected(message) => PluginError::Js(message),
        other => other,
    }
}

/// What a failed `describe` at load means for a JavaScript source.
pub(crate) fn describe_failed(f: PluginFailure) -> PluginError {
    match f {
        PluginFailure::Guest(message) | PluginFailure::InvalidOutput(message) => PluginError::Js(message),
        other => PluginError::Js(format!("evaluating it and calling describe failed: plugin:{other}")),
    }
}

/// Links the runtime's own imports: `js-source`, the source of the store's plugin (empty
/// for a component plugin, which never imports it), and `js-failure`, which ends the call
/// with a [`JsFailure`].
pub(super) fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let mut source = linker.instance(SOURCE_IMPORT)?;
    source.func_wrap("source", |store, (): ()| {
        let state: &HostState = store.data();
        Ok((state.js_source.as_deref().unwrap_or_default().to_string(),))
    })?;
    source.func_wrap("max-output-bytes", |store, (): ()| {
        let state: &HostState = store.data();
        Ok((u32::try_from(state.max_host_bytes).unwrap_or(u32::MAX),))
    })?;
    linker.instance(FAILURE_IMPORT)?.func_wrap("fail", |_store, (kind, message): (FailureKind, String)| {
        Err::<(), _>(wasmtime::Error::new(JsFailure { kind, message }))
    })?;
    Ok(())
}

/// The shared runtime: found, compiled (or mapped from the cache) and pre-instantiated
/// on the first JavaScript load, then reused by every tenant.
pub(crate) struct JsRuntime {
    /// Where it may be, in order: `plugins.js_runtime` alone when set, else [`places`].
    places: Vec<PathBuf>,
    cache_dir: Option<PathBuf>,
    engine_key: String,
    loaded: Mutex<Option<PluginPre<HostState>>>,
    /// Where its artifact may be, named by the runtime's SHA-256 (hashed once: 12 MB).
    artifacts: OnceLock<Vec<PathBuf>>,
    /// The operator was told that there is none (once: every JavaScript load asks).
    missing_logged: AtomicBool,
}

/// Where the runtime is looked for when `plugins.js_runtime` is unset, in this order:
/// beside the executable (an installed `herald`); in `js-runtime/` of the cargo target
/// directory the executable was built in (`target/release/herald` finds
/// `target/js-runtime/`, where `scripts/build-js-runtime` leaves it, from any working
/// directory); in `target/js-runtime/` of the working directory (a repository's root).
fn places(exe: Option<&Path>, cwd: Option<&Path>) -> Vec<PathBuf> {
    let exe_dir = exe.and_then(Path::parent);
    let beside = exe_dir.map(|dir| dir.join(DEFAULT_FILE));
    let built = exe_dir.and_then(Path::parent).map(|target| target.join(BUILD_DIR).join(DEFAULT_FILE));
    let here = cwd.map(|dir| dir.join("target").join(BUILD_DIR).join(DEFAULT_FILE));
    let mut places: Vec<PathBuf> = Vec::new();
    for place in [beside, built, here].into_iter().flatten() {
        if !places.contains(&place) {
            places.push(place);
        }
    }
    places
}

impl JsRuntime {
    pub(crate) fn new(cfg: &PluginConfig, engine_key: String) -> JsRuntime {
        let places = match &cfg.js_runtime {
            Some(path) => vec![path.clone()],
            None => places(std::env::current_exe().ok().as_deref(), std::env::current_dir().ok().as_deref()),
        };
        let runtime = JsRuntime {
            places,
            cache_dir: cfg.cache_dir.clone(),
            engine_key,
            loaded: Mutex::new(None),
            artifacts: OnceLock::new(),
            missing_logged: AtomicBool::new(false),
        };
        if let Some(path) = runtime.path() {
            tracing::info!(path = %path.display(), "JavaScript plugins run on this runtime");
        }
        runtime
    }

    /// The runtime file: the first of its places that is a file.
    fn path(&self) -> Option<&Path> {
        self.places.iter().map(PathBuf::as_path).find(|p| p.is_file())
    }

    /// `None` when the runtime is there; else where it was looked for, for the operator
    /// (`herald plugin check|run` print it; a tenant is never shown it).
    pub(crate) fn missing(&self) -> Option<String> {
        if self.path().is_some() {
            return None;
        }
        let looked: Vec<String> = self.places.iter().map(|p| p.display().to_string()).collect();
        Some(format!("no JavaScript runtime at {}", looked.join(", ")))
    }

    /// The pre-instantiated runtime, loading it on first use. Held under a lock, so two
    /// first uploads compile it once.
    pub(crate) fn pre(&self, engine: &Engine, linker: &Linker<HostState>) -> Result<PluginPre<HostState>, PluginError> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pre) = &*loaded {
            return Ok(pre.clone());
        }
        let Some(path) = self.path() else {
            if !self.missing_logged.swap(true, Ordering::Relaxed) {
                let looked = self.missing().unwrap_or_default();
                tracing::warn!(looked, "JavaScript plugins are refused: set plugins.js_runtime");
            }
            return Err(PluginError::Invalid(
                "no \\0asm magic, and this server runs no JavaScript plugins (no JavaScript runtime is installed)"
                    .into(),
            ));
        };
        let component = self.component(engine, path)?;
        let pre = linker.instantiate_pre(&component).and_then(PluginPre::new);
        let pre = pre.map_err(|e| unusable(path, "the JavaScript runtime does not link", root_message(&e)))?;
        *loaded = Some(pre.clone());
        Ok(pre)
    }

    /// Whether a compiled artifact of the runtime is at hand (loading is then cheap).
    pub(crate) fn is_cached(&self) -> bool {
        let Some(path) = self.path() else { return false };
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
        let bytes = std::fs::read(path).map_err(|e| unusable(path, "cannot read the JavaScript runtime", e))?;
        let candidates = self.artifact_paths(path, &bytes).clone();
        for artifact in candidates.iter().filter(|p| p.is_file()) {
            match deserialize(engine, artifact) {
                Ok(component) => return Ok(component),
                Err(e) => {
                    tracing::warn!(path = %artifact.display(), error = %root_message(&e), "unusable compiled JavaScript runtime")
                }
            }
        }
        let started = std::time::Instant::now();
        let compiled = engine
            .precompile_component(&bytes)
            .map_err(|e| unusable(path, "cannot compile the JavaScript runtime", root_message(&e)))?;
        let target = &candidates[0];
        let (dir, file) = (target.parent().unwrap_or(Path::new(".")), target.file_name().unwrap_or_default());
        write_atomically(dir, &file.to_string_lossy(), &compiled).map_err(|e| match e {
            PluginError::Io { source, .. } => unusable(target, "cannot store the compiled JavaScript runtime", source),
            other => other,
        })?;
        tracing::info!(path = %target.display(), ms = started.elapsed().as_millis() as u64, "JavaScript runtime compiled");
        deserialize(engine, target)
            .map_err(|e| unusable(target, "the compiled JavaScript runtime is unusable", root_message(&e)))
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

/// A failure of the runtime file or its artifact. The operator's log gets the path; the
/// error, which a tenant's upload may answer with, does not.
fn unusable(path: &Path, what: &'static str, cause: impl std::fmt::Display) -> PluginError {
    tracing::error!(path = %path.display(), error = %cause, "{what}");
    PluginError::Engine(format!("{what}: {cause}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_is_looked_for_beside_the_binary_in_its_build_and_in_the_working_directory() {
        let exe = Path::new("/src/herald/target/release/herald");
        assert_eq!(
            places(Some(exe), Some(Path::new("/home/ada/tagger"))),
            [
                "/src/herald/target/release/herald-js.wasm",
                "/src/herald/target/js-runtime/herald-js.wasm",
                "/home/ada/tagger/target/js-runtime/herald-js.wasm",
            ]
            .map(PathBuf::from)
        );
        // From the repository's root, the last place is the second one: said once.
        let places = places(Some(exe), Some(Path::new("/src/herald")));
        assert_eq!(places.len(), 2, "{places:?}");
        assert_eq!(super::places(None, None), Vec::<PathBuf>::new());
    }

    #[test]
    fn a_set_runtime_is_the_only_place_and_a_missing_one_names_no_path_to_a_tenant() {
        let mut cfg = PluginConfig::new("plugins");
        cfg.js_runtime = Some(PathBuf::from("/opt/secret/place/herald-js.wasm"));
        let runtime = JsRuntime::new(&cfg, "key".into());
        assert_eq!(runtime.places, [PathBuf::from("/opt/secret/place/herald-js.wasm")]);
        let missing = runtime.missing().unwrap();
        assert!(missing.contains("/opt/secret/place"), "the operator's CLI says where: {missing}");
        let engine = Engine::default();
        let err = runtime.pre(&engine, &Linker::new(&engine)).err().unwrap();
        assert!(err.is_client_error() && !err.to_string().contains("/opt"), "{err}");
        assert!(err.to_string().contains("runs no JavaScript plugins"), "{err}");
    }
}
