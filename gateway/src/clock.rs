//! The wall clock, read only by I/O shells (api, worker); policies get `now` passed in.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::Millis;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}
