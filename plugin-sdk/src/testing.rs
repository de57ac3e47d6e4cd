//! Unit-test a plugin's hooks without Herald: on the machine's own target (`cargo test`),
//! [`config`](crate::config) reads the map set here and [`log`](crate::log) lines are
//! kept here; the helpers build the inputs Herald would pass and call a hook the way
//! Herald does (only declared hooks; `classify` only for its declared statuses).
//!
//! ```
//! use plugin_sdk::testing::{self, Call};
//! use plugin_sdk::{Hooks, Plugin, Request, TransformResult, DeliveryContext};
//!
//! struct Tag;
//! impl Plugin for Tag {
//!     const HOOKS: Hooks = Hooks::TRANSFORM;
//!     fn transform(_ctx: &DeliveryContext, mut req: Request) -> Result<TransformResult, String> {
//!         let tag = plugin_sdk::config("tag").unwrap_or_default();
//!         plugin_sdk::log::info(&format!("tagging {tag}"));
//!         req.set_header("x-tag", tag);
//!         Ok(TransformResult::Send(req))
//!     }
//! }
//!
//! testing::set_config(&[("tag", "blue")]);
//! let out = Call::new().transform::<Tag>(testing::request(r#"{"id":"evt_1"}"#)).unwrap();
//! let TransformResult::Send(req) = out else { panic!("dropped") };
//! assert_eq!(req.header("x-tag"), Some("blue"));
//! assert_eq!(testing::logs(), [(plugin_sdk::Level::Info, "tagging blue".to_string())]);
//! ```

use std::cell::RefCell;
use std::collections::HashMap;

use crate::{
    DeliveryContext, Header, Hooks, Level, Outcome, Plugin, Request, Response, TransformResult, TransportError,
    TransportErrorKind, Verdict,
};

thread_local! {
    static CONFIG: RefCell<HashMap<String, String>> = RefCell::new(HashMap::new());
    static LOGS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
}

/// Replaces this thread's plugin configuration (what [`config`](crate::config) reads).
pub fn set_config(pairs: &[(&str, &str)]) {
    CONFIG.with_borrow_mut(|c| *c = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
}

/// Takes the log lines this thread's hooks wrote since the last call.
pub fn logs() -> Vec<(Level, String)> {
    LOGS.with_borrow_mut(std::mem::take)
}

#[cfg_attr(target_family = "wasm", allow(dead_code))]
pub(crate) fn config_value(key: &str) -> Option<String> {
    CONFIG.with_borrow(|c| c.get(key).cloned())
}

#[cfg_attr(target_family = "wasm", allow(dead_code))]
pub(crate) fn record_log(level: Level, message: &str) {
    LOGS.with_borrow_mut(|l| l.push((level, message.to_string())));
}

/// A JSON request as Herald passes it to `transform` and `sign`: `body` with
/// `content-type: application/json`.
pub fn request(body: &str) -> Request {
    Request { headers: vec![("content-type".into(), "application/json".into())], body: body.as_bytes().to_vec() }
}

/// An outcome with `status`, no headers and an empty body.
pub fn response(status: u16) -> Outcome {
    Outcome::Response(Response { status, headers: Vec::new(), body: Vec::new() })
}

/// A transport failure (no response).
pub fn transport_error(kind: TransportErrorKind) -> Outcome {
    Outcome::TransportError(TransportError { kind, message: format!("{kind:?}") })
}

/// One call's context; [`Call::new`] fills in a plausible first attempt.
pub struct Call {
    pub ctx: DeliveryContext,
}

impl Default for Call {
    fn default() -> Self {
        Self::new()
    }
}

impl Call {
    /// Tenant `acme`, endpoint `ep_test`, event `evt_test` of type `test.event`, attempt 1.
    pub fn new() -> Call {
        Call {
            ctx: DeliveryContext {
                tenant: "acme".into(),
                endpoint_id: "ep_test".into(),
                event_id: "evt_test".into(),
                event_type: "test.event".into(),
                attempt: 1,
                timestamp: 1_700_000_000,
                attempt_id: "att_test".into(),
            },
        }
    }

    /// The same call for an event of type `event_type`.
    pub fn event_type(mut self, event_type: &str) -> Call {
        self.ctx.event_type = event_type.into();
        self
    }

    /// Calls `P::transform` as Herald would. Panics if `P` does not declare it.
    pub fn transform<P: Plugin>(&self, req: Request) -> Result<TransformResult, String> {
        assert!(P::HOOKS.contains(Hooks::TRANSFORM), "the plugin does not declare Hooks::TRANSFORM");
        P::transform(&self.ctx, req)
    }

    /// Calls `P::classify` as Herald would: a response whose status is not in
    /// `CLASSIFY_STATUSES` never reaches the plugin (the built-in table decides).
    pub fn classify<P: Plugin>(&self, outcome: &Outcome) -> Verdict {
        assert!(P::HOOKS.contains(Hooks::CLASSIFY), "the plugin does not declare Hooks::CLASSIFY");
        match (P::CLASSIFY_STATUSES, outcome.status()) {
            (Some(wanted), Some(status)) if !wanted.contains(&status) => Verdict::Default,
            _ => P::classify(&self.ctx, outcome),
        }
    }

    /// Calls `P::sign` with raw secrets, newest first.
    pub fn sign<P: Plugin>(&self, secrets: &[Vec<u8>], req: &Request) -> Result<Vec<Header>, String> {
        assert!(P::HOOKS.contains(Hooks::SIGN), "the plugin does not declare Hooks::SIGN");
        P::sign(&self.ctx, secrets, req)
    }
}
