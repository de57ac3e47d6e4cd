//! What a plugin hands back, checked before the host uses it: verdicts, headers and
//! reasons within their limits, and every way a call can fail named as one
//! [`PluginFailure`].

use wasmtime::Trap;
use wasmtime::component::{ComponentType, Lift};

use super::types::PluginFailure;
use super::{Header, Verdict};

/// Reasons and names in plugin output longer than this are truncated.
pub(super) const MAX_REASON: usize = 1024;
/// The longest pause a plugin may ask for: seven days.
const MAX_PAUSE_SECS: u32 = 7 * 24 * 3600;
/// Most headers one call may return: a list of many tiny headers is as costly to check,
/// store and send as a big body, and no webhook needs more.
const MAX_HEADERS: usize = 64;
/// Headers the sender owns: removed from what plugins return.
const RESERVED_HEADERS: [&str; 5] = ["host", "content-length", "transfer-encoding", "connection", "upgrade"];

/// What the runtime says went wrong, in `fail` (`wit/js.wit`).
#[derive(ComponentType, Lift, Clone, Copy, Debug, PartialEq, Eq)]
#[component(enum)]
#[repr(u8)]
#[allow(dead_code)] // Its values are lifted from the runtime's argument, never written here.
pub(super) enum FailureKind {
    #[component(name = "invalid-output")]
    InvalidOutput,
    #[component(name = "error")]
    Error,
    #[component(name = "output-too-large")]
    OutputTooLarge,
}

/// A call the runtime ended through `fail`: the error its trap carries.
#[derive(Debug, thiserror::Error)]
#[error("the JavaScript runtime ended the call: {message}")]
pub(super) struct JsFailure {
    pub(super) kind: FailureKind,
    pub(super) message: String,
}

impl JsFailure {
    /// The call's failure: `plugin:invalid_output: …` or `plugin:error: …`.
    pub(super) fn failure(&self) -> PluginFailure {
        let message = truncate(self.message.clone(), MAX_REASON);
        match self.kind {
            FailureKind::InvalidOutput => PluginFailure::InvalidOutput(message),
            FailureKind::Error => PluginFailure::Guest(message),
            FailureKind::OutputTooLarge => PluginFailure::OutputTooLarge,
        }
    }
}

/// The current call's host calls took more than the output cap from the guest: it ends
/// as `output_too_large`.
#[derive(Debug)]
pub(super) struct HostBytesExhausted;

impl std::fmt::Display for HostBytesExhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the call's host calls took more than the output cap from the plugin")
    }
}

impl std::error::Error for HostBytesExhausted {}

pub(super) fn failure_from(err: &wasmtime::Error, memory_exceeded: bool) -> PluginFailure {
    if memory_exceeded {
        return PluginFailure::Memory(String::new());
    }
    // `exit()` in a guest (Rust's `std::process::exit`, or the abort after a panic on
    // some toolchains) is the guest ending the call: a trap with its status.
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return PluginFailure::Trap(format!("exit({})", exit.0));
    }
    // The JavaScript runtime ended the call, saying why (a field it refused, a syntax error).
    if let Some(js) = err.downcast_ref::<JsFailure>() {
        return js.failure();
    }
    // wasmtime's error type for this is private, so it is recognised by its message
    // (`aliased_output_is_refused_before_the_host_copies_it` notices if that changes).
    if err.downcast_ref::<HostBytesExhausted>().is_some()
        || err.chain().any(|e| e.to_string().contains("fuel allocated for hostcalls has been exhausted"))
    {
        return PluginFailure::OutputTooLarge;
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => PluginFailure::Timeout(String::new()),
        Some(Trap::StackOverflow) => PluginFailure::Trap("stack overflow".to_string()),
        Some(trap) => PluginFailure::Trap(truncate(trap.to_string(), 200)),
        // Not a trap: the canonical ABI refused what the guest handed back (bad
        // UTF-8, out-of-bounds list, unknown discriminant, …).
        // The root cause only: the context above it is a wasm backtrace.
        None => PluginFailure::InvalidOutput(truncate(err.root_cause().to_string(), 200)),
    }
}

pub(super) fn is_pool_exhausted(err: &wasmtime::Error) -> bool {
    err.downcast_ref::<wasmtime::PoolConcurrencyLimitError>().is_some()
}

pub(crate) fn root_message(err: &wasmtime::Error) -> String {
    let mut msg = err.to_string();
    for cause in err.chain().skip(1) {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
    }
    msg
}

/// Reasons over the output cap are an error; within it they are cut to 1 KiB.
pub(super) fn check_verdict(verdict: Verdict, max_output_bytes: usize) -> Result<Verdict, PluginFailure> {
    let reason_len = match &verdict {
        Verdict::Fail(r) | Verdict::DisableEndpoint(r) | Verdict::PauseEndpoint(super::Pause { reason: r, .. }) => {
            r.len()
        }
        _ => 0,
    };
    if reason_len > max_output_bytes {
        return Err(PluginFailure::OutputTooLarge);
    }
    Ok(match verdict {
        Verdict::Fail(reason) => Verdict::Fail(truncate(reason, MAX_REASON)),
        Verdict::DisableEndpoint(reason) => Verdict::DisableEndpoint(truncate(reason, MAX_REASON)),
        Verdict::PauseEndpoint(p) if p.secs == 0 || p.secs > MAX_PAUSE_SECS => {
            return Err(PluginFailure::InvalidOutput(format!(
                "pause-endpoint of {} s (allowed: 1..={MAX_PAUSE_SECS})",
                p.secs
            )));
        }
        Verdict::PauseEndpoint(mut p) => {
            p.reason = truncate(p.reason, MAX_REASON);
            Verdict::PauseEndpoint(p)
        }
        other => other,
    })
}

/// At most [`MAX_HEADERS`]; names must be HTTP tokens and values visible ASCII or
/// spaces, as the WIT says (no control characters, no raw UTF-8).
pub(super) fn check_headers(headers: &[Header]) -> Result<(), PluginFailure> {
    if headers.len() > MAX_HEADERS {
        return Err(PluginFailure::InvalidOutput(format!("{} headers (at most {MAX_HEADERS})", headers.len())));
    }
    for (name, value) in headers {
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || name.len() > 256 || !name.bytes().all(token) {
            return Err(PluginFailure::InvalidOutput(format!("bad header name {:?}", truncate(name.clone(), 64))));
        }
        if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(PluginFailure::InvalidOutput(format!("header {name}: values must be visible ASCII or spaces")));
        }
    }
    Ok(())
}

/// Drops the headers the sender owns (`host`, `content-length`, …): a plugin reshapes
/// the message, never the destination or the framing.
pub(super) fn strip_reserved(mut headers: Vec<Header>) -> Vec<Header> {
    headers.retain(|(n, _)| !RESERVED_HEADERS.iter().any(|r| n.eq_ignore_ascii_case(r)));
    headers
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
