//! How a plugin behaves, as `GET …/plugins/{name}` shows it beside the plugin: calls and
//! failures per hook, failures by reason, p50/p99 call time, and the latest failures with
//! their messages and the plugin's log lines.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use crate::plugin::{FailureRecord, PluginStats};

/// Figures since this node started (each node counts its own calls).
#[derive(Serialize, ToSchema)]
pub(crate) struct StatsOut {
    calls: u64,
    failures: u64,
    hooks: Vec<HookStatsOut>,
    /// `timeout`, `trap`, `memory`, `invalid_output`, `output_too_large`, `error`, `busy`, …
    failures_by_reason: BTreeMap<String, u64>,
    /// Over the latest 1024 calls, queueing on the call pool included; null before any.
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    /// The latest 20 failures, newest first.
    recent_failures: Vec<FailureOut>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct HookStatsOut {
    hook: &'static str,
    calls: u64,
    failures: u64,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct FailureOut {
    /// RFC 3339.
    at: String,
    hook: &'static str,
    reason: &'static str,
    /// As the attempt records it: `plugin:<reason>: <message>`.
    message: String,
    event_id: String,
    attempt_id: String,
    /// The call's log lines (its last 20).
    logs: Vec<LogLineOut>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct LogLineOut {
    level: &'static str,
    message: String,
}

/// Milliseconds to the microsecond: `3.181`, not the `3.1809999999999996` that
/// `as_secs_f64() * 1000.0` gives (an integer over a power of ten rounds to the shortest
/// decimal).
fn ms(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

fn failure(f: &FailureRecord) -> FailureOut {
    let at = f.at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    FailureOut {
        at: crate::clock::rfc3339(at),
        hook: f.hook.as_str(),
        reason: f.reason,
        message: f.message.clone(),
        event_id: f.event_id.clone(),
        attempt_id: f.attempt_id.clone(),
        logs: f.logs.iter().map(|(level, message)| LogLineOut { level, message: message.clone() }).collect(),
    }
}

pub(super) fn view(s: &PluginStats) -> StatsOut {
    StatsOut {
        calls: s.hooks.iter().map(|(_, calls, _)| calls).sum(),
        failures: s.hooks.iter().map(|(_, _, failures)| failures).sum(),
        hooks: s
            .hooks
            .iter()
            .map(|(hook, calls, failures)| HookStatsOut { hook: hook.as_str(), calls: *calls, failures: *failures })
            .collect(),
        failures_by_reason: s.failures_by_reason.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        p50_ms: s.p50.map(ms),
        p99_ms: s.p99.map(ms),
        recent_failures: s.recent_failures.iter().map(failure).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn milliseconds_carry_no_float_noise() {
        assert_eq!(super::ms(Duration::from_micros(3181)).to_string(), "3.181");
        assert_eq!(super::ms(Duration::from_nanos(3_181_999)).to_string(), "3.181");
        assert_eq!(super::ms(Duration::from_millis(7)).to_string(), "7");
        assert_eq!(serde_json::json!(super::ms(Duration::from_micros(100_013))).to_string(), "100.013");
    }
}
