//! Write Herald plugins in Rust.
//!
//! A Herald plugin is a WebAssembly component for the `herald:plugin@0.1.0` world
//! (see `wit/plugin.wit`, the one definition of the contract). This crate hides the
//! bindings: implement [`Plugin`] — every method has a default, so override only the
//! hooks you need and list them in [`Plugin::HOOKS`] — and call [`export!`] once.
//!
//! Plugins are pure functions of their inputs: no network, no files, no environment,
//! no clock or randomness beyond the [`DeliveryContext`]. Every call has a time budget
//! (10 ms by default) and a memory cap (16 MiB). Instances may be reused between calls
//! of the same plugin version, so never rely on global state surviving (or not
//! surviving) from one call to the next.
//!
//! # A complete plugin
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "classify-409"
//! version = "0.1.0"
//! edition = "2024"
//!
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! plugin-sdk = { path = "../../plugin-sdk" }
//! ```
//!
//! `src/lib.rs`:
//!
//! ```no_run
//! use plugin_sdk::{config, log, DeliveryContext, Hooks, Outcome, Plugin, Verdict};
//!
//! /// Treats `409 Conflict` as "the receiver already has this event".
//! struct AlreadyProcessed;
//!
//! impl Plugin for AlreadyProcessed {
//!     const HOOKS: Hooks = Hooks::CLASSIFY;
//!     const CLASSIFY_STATUSES: Option<&'static [u16]> = Some(&[409]);
//!
//!     fn classify(ctx: &DeliveryContext, outcome: &Outcome) -> Verdict {
//!         if outcome.status() != Some(409) {
//!             return Verdict::Default; // Herald's built-in table decides
//!         }
//!         log::info(&format!("409 for {}: treating as delivered", ctx.event_id));
//!         match config("on_409").as_deref() {
//!             Some("retry") => Verdict::Retry(Some(60)),
//!             _ => Verdict::Delivered,
//!         }
//!     }
//! }
//!
//! plugin_sdk::export!(AlreadyProcessed);
//! # fn main() {}
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`, try it with
//! `herald plugin check target/wasm32-wasip2/release/classify_409.wasm` and
//! `herald plugin run … --hook classify --input outcome.json`, then upload it with
//! `PUT /v1/tenants/{tenant}/plugins/{name}` and bind it on an endpoint with
//! `"plugins": {"classify": "{name}"}`.

#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "herald:plugin/plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "plugin_sdk::__bindings",
    });
}

#[cfg(target_family = "wasm")]
use __bindings::herald::plugin::host;
pub use __bindings::herald::plugin::types::{
    DeliveryContext, Header, Hooks, Level, Outcome, Pause, PluginInfo, Request, Response, TransformResult,
    TransportError, TransportErrorKind, Verdict,
};

/// A Herald plugin. Override the hooks you implement and name them in [`Self::HOOKS`];
/// Herald only calls the hooks listed there.
pub trait Plugin {
    /// The hooks this plugin implements, e.g. `Hooks::CLASSIFY | Hooks::SIGN`.
    const HOOKS: Hooks = Hooks::empty();
    /// The name reported by `describe`; the crate name when empty.
    const NAME: &'static str = "";
    /// The version reported by `describe`; the crate version when empty.
    const VERSION: &'static str = "";
    /// The response statuses [`Self::classify`] has an opinion on; `None` (the default)
    /// means every outcome. With `Some(&[409])`, Herald calls `classify` only for 409s
    /// and transport errors and judges every other response with its built-in table,
    /// saving a call per delivery.
    const CLASSIFY_STATUSES: Option<&'static [u16]> = None;

    /// Reshape the request (body and headers), or drop the delivery with
    /// `TransformResult::Drop(reason)`. An `Err` fails the attempt, which is retried.
    /// Default: send the request unchanged.
    fn transform(ctx: &DeliveryContext, req: Request) -> Result<TransformResult, String> {
        let _ = ctx;
        Ok(TransformResult::Send(req))
    }

    /// Decide what an attempt's outcome means. Default: [`Verdict::Default`], i.e.
    /// Herald's built-in response table.
    fn classify(ctx: &DeliveryContext, outcome: &Outcome) -> Verdict {
        let _ = (ctx, outcome);
        Verdict::Default
    }

    /// Compute the signature headers for `req` with each raw secret in `secrets`
    /// (newest first). Default: an error, as Herald never calls an undeclared hook.
    fn sign(ctx: &DeliveryContext, secrets: &[Vec<u8>], req: &Request) -> Result<Vec<Header>, String> {
        let _ = (ctx, secrets, req);
        Err("this plugin does not implement sign".to_string())
    }
}

/// Reads a key of this plugin's configuration (set by the operator for this tenant
/// and plugin in Herald's TOML). `None` when unset.
///
/// An instance only ever serves one loaded version of one tenant's plugin, whose
/// configuration is fixed when Herald loads it, so each key is asked of the host once
/// per instance and then answered from memory (a host call per lookup cost more than
/// some hooks' whole work).
pub fn config(key: &str) -> Option<String> {
    // Outside WebAssembly there is no Herald: unit tests set the map (see `testing`).
    #[cfg(not(target_family = "wasm"))]
    {
        testing::config_value(key)
    }
    #[cfg(target_family = "wasm")]
    {
        cached_config(key)
    }
}

#[cfg(target_family = "wasm")]
fn cached_config(key: &str) -> Option<String> {
    thread_local! {
        static CACHE: std::cell::RefCell<Vec<(String, Option<String>)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    CACHE.with_borrow_mut(|cache| {
        if let Some((_, value)) = cache.iter().find(|(k, _)| k == key) {
            return value.clone();
        }
        let value = host::get_config(key);
        cache.push((key.to_string(), value.clone()));
        value
    })
}

pub mod testing;

/// Sends a log line to Herald, or to [`testing::logs`] outside WebAssembly.
fn emit(level: Level, message: &str) {
    #[cfg(not(target_family = "wasm"))]
    testing::record_log(level, message);
    #[cfg(target_family = "wasm")]
    host::log(level, message);
}

/// Log lines, recorded in Herald's structured log with the tenant, plugin and attempt.
/// Lines past 1 KiB are truncated; at most 32 lines per call are kept.
pub mod log {
    use super::Level;

    /// Logs at `trace` level.
    pub fn trace(message: &str) {
        super::emit(Level::Trace, message);
    }
    /// Logs at `debug` level.
    pub fn debug(message: &str) {
        super::emit(Level::Debug, message);
    }
    /// Logs at `info` level.
    pub fn info(message: &str) {
        super::emit(Level::Info, message);
    }
    /// Logs at `warn` level.
    pub fn warn(message: &str) {
        super::emit(Level::Warn, message);
    }
    /// Logs at `error` level.
    pub fn error(message: &str) {
        super::emit(Level::Error, message);
    }
}

impl Request {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// Sets header `name`, replacing every existing value (case-insensitive).
    pub fn set_header(&mut self, name: &str, value: impl Into<String>) {
        self.remove_header(name);
        self.headers.push((name.to_string(), value.into()));
    }

    /// Removes every value of header `name` (case-insensitive).
    pub fn remove_header(&mut self, name: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }
}

impl Outcome {
    /// The HTTP status, when the receiver answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Response(r) => Some(r.status),
            Outcome::TransportError(_) => None,
        }
    }
}

fn find_header<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

#[doc(hidden)]
pub mod __private {
    //! What [`export!`](crate::export) expands to; not a stable interface.
    use super::*;
    pub use crate::__bindings::Guest;

    pub fn describe<P: Plugin>(crate_name: &str, crate_version: &str) -> PluginInfo {
        let pick = |own: &str, fallback: &str| if own.is_empty() { fallback } else { own }.to_string();
        PluginInfo {
            name: pick(P::NAME, crate_name),
            version: pick(P::VERSION, crate_version),
            hooks: P::HOOKS,
            classify_statuses: P::CLASSIFY_STATUSES.map(<[u16]>::to_vec),
        }
    }
}

/// Exports `$plugin` (a type implementing [`Plugin`]) as this crate's component.
/// Call it exactly once, at the top level of a `cdylib` crate.
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        const _: () = {
            struct __HeraldGuest;

            impl $crate::__private::Guest for __HeraldGuest {
                fn describe() -> $crate::PluginInfo {
                    $crate::__private::describe::<$plugin>(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
                }
                fn transform(
                    ctx: $crate::DeliveryContext,
                    req: $crate::Request,
                ) -> Result<$crate::TransformResult, String> {
                    <$plugin as $crate::Plugin>::transform(&ctx, req)
                }
                fn classify(ctx: $crate::DeliveryContext, outcome: $crate::Outcome) -> $crate::Verdict {
                    <$plugin as $crate::Plugin>::classify(&ctx, &outcome)
                }
                fn sign(
                    ctx: $crate::DeliveryContext,
                    secrets: Vec<Vec<u8>>,
                    req: $crate::Request,
                ) -> Result<Vec<$crate::Header>, String> {
                    <$plugin as $crate::Plugin>::sign(&ctx, &secrets, &req)
                }
            }

    $crate::__bindings::__export_plugin_world!(__HeraldGuest with_types_in $crate::__bindings);
        };
    };
}
