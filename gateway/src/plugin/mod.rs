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
