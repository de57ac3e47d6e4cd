//! WebAssembly plugins: the `herald:plugin@0.1.0` world (`wit/plugin.wit`) hosted in a
//! sandbox, with a per-tenant registry that hot-reloads `<dir>/<tenant>/<name>.wasm`.
//!
//! Architecture invariant: this is the only module that links wasmtime. It never
//! sends webhooks, touches the store or reads endpoint state: it turns a (tenant,
//! plugin, hook, input) into an output or a [`PluginFailure`], and the worker decides
//! what that means (`plugin:<reason>` for `transform`/`sign`, the built-in table for a
//! failed `classify`).
//!
//! - [`PluginHost`] — start, call hooks, list, install, counters.
//! - [`check_file`] / [`run_hook_file`] — `herald plugin check|run`;
//!   [`compile_child`] — the hidden `herald plugin compile` the server compiles in;
//!   [`new_js_plugin`] — `herald plugin new --lang js`.
//! - A plugin file is a component or JavaScript source (`js`), which runs on one shared
//!   JavaScript runtime component.
//! - The hook data types ([`DeliveryContext`], [`Request`], [`Outcome`], [`Verdict`],
//!   …) are generated from the WIT by the one `bindgen!` below.
//!
//! How a call runs: with a CPU-time budget, a memory cap and output caps (hostcall fuel
//! included; the output checks and failure mapping in `output`), on a pool of dedicated
//! threads (`pool`) where tenants take turns and none holds every thread; a call past 1 ms
//! of CPU continues at `SCHED_IDLE`, so anything else on the node preempts it (normal again
//! if starved there); a tenant whose call used its whole budget is penalised onto a lane of
//! its own (one idle thread) for 10 s. Warm
//! instances are reused per plugin version, the load's own kept so a first call does not
//! instantiate (dropped when idle, so an unused plugin holds no pool slot for long), each with its WASI context built once and per-call inputs (timestamp,
//! attempt-seeded random) in a shared cell (`sandbox`); an epoch ticker sleeps while no
//! call runs (`ticker`). `classify` is called only for the statuses a plugin declares in
//! `describe`; each loaded version carries its tenant's limits (`[plugins.tenant.<tenant>]`
//! over `[plugins]`: time budget, memory cap).
//!
//! The per-tenant registry (`registry`): tenant limits and atomic install; what a tenant
//! stores (serving files and kept versions) against its byte limit and which old versions
//! an upload lets go, never a pinned one (`registry/usage.rs`); background loading, the
//! hot-reloading watcher and the idle sweeper (`registry/files.rs`); numbered versions
//! beside the serving file, rollback, pinned `name@n` loads and deletion
//! (`registry/versions.rs`); the three layers of a plugin's settings
//! (`registry/settings.rs`); per-plugin call figures, p50/p99 and the latest failures with
//! their log lines (`registry/stats.rs`).
//!
//! Components are checked structurally (`inspect`, wasmparser) before anything is compiled;
//! `compile` bounds compiles (one at a time, in a `herald plugin compile` child with memory
//! and time limits) and caches their artifacts outside the plugins directory (`artifacts`:
//! the atomic write every upload and artifact goes through, and mapping one back; `engine`:
//! the wasmtime configuration the server and the compile child share, and the server's
//! instance pool). The binary allocates with mimalloc (`main.rs`); the child is started with
//! its arenas reserved without access (`MIMALLOC_ARENA_EAGER_COMMIT=0`), so every commit of
//! memory meets its `RLIMIT_DATA`.
//!
//! JavaScript (`js`): a plugin file that is not a component is JavaScript source. It runs on
//! the one JavaScript runtime component (`sdk-js/runtime.js` on `wit/js.wit`'s `js-runtime`
//! world, operator-supplied or found beside the binary or in `target/js-runtime`, compiled
//! in process once and cached beside the other artifacts), which reads the tenant's source
//! through the `js-source` import and evaluates it once per instance; the instances are the
//! tenant's own, as for a component. `sdk-js/plugin-host.js` is the one rule for evaluating
//! a source and converting what its hooks return (shared with the node test kit); what a
//! hook's type cannot hold, or a source that does not evaluate, ends the call through the
//! `js-failure` import with a message naming the field or the line (`plugin:invalid_output`,
//! `plugin:error`), never a bare trap.

mod artifacts;
mod cli;
mod compile;
mod convert;
mod engine;
mod inspect;
mod js;
mod output;
mod pool;
mod registry;
mod runtime;
mod sandbox;
mod ticker;
mod types;

#[cfg(test)]
mod tests;

pub use cli::{check_file, run_hook_file};
pub use compile::{EXIT_INVALID, compile_child};
pub use convert::verdict;
pub use registry::{FailureRecord, MAX_VERSIONS, PluginHost, PluginStats, PluginVersion, RECENT_FAILURES};
pub use types::{
    Hook, HookSet, PluginConfig, PluginError, PluginFailure, PluginInfo, PluginMetrics, PluginValues, StructureLimits,
    TenantLimitOverrides, TenantLimits, check_slug, is_slug, split_pinned,
};

/// The hook data types, generated from `wit/plugin.wit`.
pub use bindings::herald::plugin::types::{
    DeliveryContext, Header, Outcome, Pause, Request, Response, TransformResult, TransportError, TransportErrorKind,
    Verdict,
};

/// The one place the WIT becomes Rust on the host side.
mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "herald:plugin/plugin",
        additional_derives: [PartialEq, Eq],
        // Host calls charge what they copy out of the guest against the call's output
        // cap (see `HostState::charge`), which can end the call.
        imports: {
            "herald:plugin/host.log": trappable,
            "herald:plugin/host.get-config": trappable,
        },
    });
}
