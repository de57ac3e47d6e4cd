//! The wall clock, read only by I/O shells (api, worker, plugin load times); policies get
//! `now` passed in.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::Millis;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> Millis {
    wall().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}

/// The wall clock (e.g. to read an HTTP date against): the one place Herald reads it
/// (`clippy.toml` refuses `SystemTime::now` anywhere else).
#[allow(clippy::disallowed_methods)]
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// Formats milliseconds since the epoch as RFC 3339 (UTC).
pub fn rfc3339(ms: Millis) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}
