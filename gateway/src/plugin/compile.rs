//! From checked component bytes to a wasmtime `Component`: a cache of compiled
//! artifacts, a bound on compiles running at once, and (on a server) compiling in a
//! child process that has a memory limit and a deadline.
//!
//! Why a child process: cranelift cannot be interrupted, and its memory is the
//! process's memory; a compile that needs gigabytes or minutes would take the node
//! with it. `herald plugin compile` sets its own `RLIMIT_DATA` and `RLIMIT_CPU`, the
//! parent kills it at `compile_timeout` of wall time, and what it leaves behind is
//! only a file in the cache. The structural checks in `inspect` refuse the known bombs
//! before any of this; the child bounds what they miss.
//!
//! The cache holds `<sha256>-<engine>.cwasm`, keyed by the component's SHA-256 and
//! the engine's compatibility hash (wasmtime version, target, tunables), so a restart
//! maps every plugin back in milliseconds and an upgrade recompiles. Loading an
//! artifact is loading native code: the cache directory must be one that only Herald
//! writes, never the tenant-fed plugins directory (`PluginHost::start` refuses that).

use std::hash::{Hash as _, Hasher as _};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::artifacts::{deserialize, write_atomically};
use super::engine::compile_engine;
use super::output::root_message;
use super::types::{PluginConfig, PluginError};

/// How often the parent looks at a compiling child. Compiles take 100 ms and more,
/// so this adds at most a few percent; std offers no wait-with-timeout on a child.
const CHILD_POLL: Duration = Duration::from_millis(5);
/// The child's exit code for "not a component wasmtime can compile".
pub const EXIT_INVALID: i32 = 2;

pub(crate) struct Compiler {
    engine: Engine,
    cache_dir: Option<PathBuf>,
    engine_key: String,
    exe: Option<PathBuf>,
    timeout: Duration,
    memory: u64,
    slots: Slots,
}

impl Compiler {
    pub(crate) fn new(engine: &Engine, cfg: &PluginConfig) -> Result<Compiler, PluginError> {
        if let Some(dir) = &cfg.cache_dir {
            std::fs::create_dir_all(dir).map_err(|e| PluginError::io(dir, e))?;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(Compiler {
            engine: engine.clone(),
            cache_dir: cfg.cache_dir.clone(),
            engine_key: format!("{:016x}", hasher.finish()),
            exe: cfg.compiler_exe.clone(),
            timeout: cfg.compile_timeout,
            memory: cfg.compile_memory,
            slots: Slots::new(cfg.compile_concurrency.max(1)),
        })
    }

    /// The engine's part of artifact names: its compatibility hash.
    pub(crate) fn engine_key(&self) -> &str {
        &self.engine_key
    }

    /// Whether the cache holds an artifact for `sha256` under this engine.
    pub(crate) fn is_cached(&self, sha256: &str) -> bool {
        self.cache_dir.as_ref().is_some_and(|dir| dir.join(self.file_name(sha256)).is_file())
    }

    fn file_name(&self, sha256: &str) -> String {
        format!("{sha256}-{}.cwasm", self.engine_key)
    }

    /// The compiled component: from the cache when it holds it, else compiled (waiting
    /// for a compile slot) and cached.
    pub(crate) fn component(&self, bytes: &[u8], sha256: &str) -> Result<Component, PluginError> {
        let Some(dir) = &self.cache_dir else {
            let _slot = self.slots.acquire();
            return Component::new(&self.engine, bytes).map_err(|e| PluginError::Invalid(root_message(&e)));
        };
        let file = self.file_name(sha256);
        let path = dir.join(&file);
        if let Some(component) = self.cached(&path) {
            return Ok(component);
        }
        let _slot = self.slots.acquire();
        // The same bytes may have been compiled while this one waited for its slot.
        if let Some(component) = self.cached(&path) {
            return Ok(component);
        }
        match &self.exe {
            Some(exe) => self.compile_in_child(exe, bytes, dir, &file)?,
            None => {
                let artifact =
                    self.engine.precompile_component(bytes).map_err(|e| PluginError::Invalid(root_message(&e)))?;
                write_atomically(dir, &file, &artifact)?;
            }
        }
        deserialize(&self.engine, &path).map_err(|e| {
            PluginError::Engine(format!("compiled artifact {} unusable: {}", path.display(), root_message(&e)))
        })
    }

    /// The cached artifact at `path`, if there is a usable one; a stale or corrupt one
    /// is removed, so it is compiled again.
    fn cached(&self, path: &Path) -> Option<Component> {
        if !path.is_file() {
            return None;
        }
        match deserialize(&self.engine, path) {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %root_message(&e), "dropping an unusable compiled plugin");
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    /// Runs `herald plugin compile` on `bytes`, leaving the artifact at `dir/file`.
    fn compile_in_child(&self, exe: &Path, bytes: &[u8], dir: &Path, file: &str) -> Result<(), PluginError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let input = dir.join(format!(".in.{}.{n}.wasm", std::process::id()));
        let output = dir.join(format!(".out.{}.{n}.cwasm", std::process::id()));
        std::fs::write(&input, bytes).map_err(|e| PluginError::io(&input, e))?;
        let result = self
            .run_child(exe, &input, &output)
            .and_then(|()| std::fs::rename(&output, dir.join(file)).map_err(|e| PluginError::io(dir.join(file), e)));
        let _ = std::fs::remove_file(&input);
        let _ = std::fs::remove_file(&output);
        result
    }

    fn run_child(&self, exe: &Path, input: &Path, output: &Path) -> Result<(), PluginError> {
        let cpu_secs = self.timeout.as_secs().max(1) + 1;
        let mut child = Command::new(exe)
            .args(["plugin", "compile", "--max-memory", &self.memory.to_string(), "--max-cpu-secs"])
            .arg(cpu_secs.to_string())
            .arg(input)
            .arg(output)
            // A backtrace needs memory the child may no longer have.
            .env("RUST_BACKTRACE", "0")
            // The binary's allocator (mimalloc) would otherwise map a 1 GiB arena writable
            // at its first allocation, before the child limits itself, and then allocate
            // from it unchecked: reserved without access, each commit meets RLIMIT_DATA.
            .env("MIMALLOC_ARENA_EAGER_COMMIT", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| PluginError::Engine(format!("cannot start the compiler {}: {e}", exe.display())))?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(PluginError::CompileLimit(format!("compiling took longer than {:?}", self.timeout)));
                }
                Ok(None) => std::thread::sleep(CHILD_POLL),
                Err(e) => return Err(PluginError::Engine(format!("waiting for the compiler: {e}"))),
            }
        };
        if status.success() {
            return Ok(());
        }
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.by_ref().take(4096).read_to_string(&mut stderr);
        }
        let message = stderr.trim().lines().last().unwrap_or("").to_string();
        // The data limit hit: the allocator's abort (a signal), or an error from a mapping
        // the engine or the compiler could not make.
        if stderr.contains("memory allocation") || stderr.contains("out of memory") {
            return Err(PluginError::CompileLimit(format!("compiling needed more than {} MiB", self.memory >> 20)));
        }
        match status.code() {
            Some(EXIT_INVALID) => Err(PluginError::Invalid(message)),
            // Killed by a signal: SIGXCPU/SIGKILL at the CPU limit.
            None => Err(PluginError::CompileLimit(format!("the compiler was stopped ({status}): {message}"))),
            Some(_) => Err(PluginError::Engine(format!("the compiler failed ({status}): {message}"))),
        }
    }
}

/// `herald plugin compile`: the child's side. Limits its own memory and CPU time, then
/// compiles `input` for an engine configured like the server's and writes `output`.
pub fn compile_child(input: &Path, output: &Path, max_memory: u64, max_cpu_secs: u64) -> Result<(), PluginError> {
    limit_self(max_memory, max_cpu_secs)?;
    let bytes = std::fs::read(input).map_err(|e| PluginError::io(input, e))?;
    let engine = compile_engine().map_err(|e| PluginError::Engine(e.to_string()))?;
    let artifact = engine.precompile_component(&bytes).map_err(|e| PluginError::Invalid(root_message(&e)))?;
    std::fs::write(output, artifact).map_err(|e| PluginError::io(output, e))
}

#[cfg(unix)]
fn limit_self(max_memory: u64, max_cpu_secs: u64) -> Result<(), PluginError> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let set = |resource, limit: u64| {
        setrlimit(resource, Rlimit { current: Some(limit), maximum: Some(limit) })
            .map_err(|e| PluginError::Engine(format!("cannot limit the compiler ({resource:?}): {e}")))
    };
    // RLIMIT_DATA counts the heap and private writable mappings, i.e. what a compile
    // allocates, but not the address space the binary and thread stacks reserve.
    set(Resource::Data, max_memory)?;
    set(Resource::Cpu, max_cpu_secs)
}

#[cfg(not(unix))]
fn limit_self(_max_memory: u64, _max_cpu_secs: u64) -> Result<(), PluginError> {
    Ok(())
}

/// A counting semaphore for blocking threads: compiles at once.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

struct Slot<'a>(&'a Slots);

impl Slots {
    fn new(n: usize) -> Slots {
        Slots { free: Mutex::new(n), freed: Condvar::new() }
    }

    fn acquire(&self) -> Slot<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}
