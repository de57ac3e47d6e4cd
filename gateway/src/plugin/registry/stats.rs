//! What a plugin's calls did, kept per (tenant, name) across reloads: calls and failures
//! per hook, failures by reason, the durations of the latest calls (for p50/p99) and the
//! latest failures with their messages and the plugin's log lines.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::plugin::types::{Hook, PluginFailure};

use super::LogCapture;

/// Durations kept for the percentiles: the latest calls.
const DURATIONS: usize = 1024;
/// Failures kept with their messages and log lines.
pub const RECENT_FAILURES: usize = 20;
/// Log lines kept per failure (the call's last ones).
const FAILURE_LOG_LINES: usize = 20;

#[derive(Default)]
pub(super) struct Stats {
    pub(super) calls: [AtomicU64; 3],
    pub(super) failures: [AtomicU64; 3],
    by_reason: [AtomicU64; PluginFailure::KINDS.len()],
    recent: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    /// Microseconds, newest last.
    durations: VecDeque<u32>,
    failures: VecDeque<FailureRecord>,
}

/// One failed call, as the plugin API shows it.
#[derive(Clone, Debug)]
pub struct FailureRecord {
    pub at: SystemTime,
    pub hook: Hook,
    /// [`PluginFailure::kind`]: `timeout`, `trap`, `error`, …
    pub reason: &'static str,
    /// The failure with its message (what `plugin:<msg>` records on the attempt).
    pub message: String,
    pub event_id: String,
    pub attempt_id: String,
    /// The call's log lines (level, message), its last ones if it wrote many.
    pub logs: Vec<(&'static str, String)>,
}

/// A plugin's figures since the node started.
#[derive(Clone, Debug, Default)]
pub struct PluginStats {
    /// (hook, calls, failures) for each hook called at least once.
    pub hooks: Vec<(Hook, u64, u64)>,
    /// Failures by [`PluginFailure::kind`], the kinds that happened.
    pub failures_by_reason: Vec<(&'static str, u64)>,
    /// Over the latest 1024 calls (queueing on the call pool included).
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
    /// The latest failures, newest first.
    pub recent_failures: Vec<FailureRecord>,
}

/// What [`Stats::record`] needs to know of a call.
pub(super) struct Call<'a> {
    pub(super) hook: Hook,
    pub(super) took: Duration,
    pub(super) event_id: &'a str,
    pub(super) attempt_id: &'a str,
}

impl Stats {
    pub(super) fn record(&self, call: Call<'_>, failure: Option<&PluginFailure>, mut logs: LogCapture) {
        let micros = u32::try_from(call.took.as_micros()).unwrap_or(u32::MAX);
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.durations.len() == DURATIONS {
            recent.durations.pop_front();
        }
        recent.durations.push_back(micros);
        let Some(failure) = failure else { return };
        self.by_reason[failure.kind_index()].fetch_add(1, Ordering::Relaxed);
        if recent.failures.len() == RECENT_FAILURES {
            recent.failures.pop_front();
        }
        let logs = logs.split_off(logs.len().saturating_sub(FAILURE_LOG_LINES));
        recent.failures.push_back(FailureRecord {
            at: crate::clock::wall(),
            hook: call.hook,
            reason: failure.kind(),
            message: format!("plugin:{failure}"),
            event_id: call.event_id.to_string(),
            attempt_id: call.attempt_id.to_string(),
            logs,
        });
    }

    pub(super) fn snapshot(&self) -> PluginStats {
        let hooks = Hook::ALL
            .iter()
            .map(|h| {
                (*h, self.calls[h.index()].load(Ordering::Relaxed), self.failures[h.index()].load(Ordering::Relaxed))
            })
            .filter(|(_, calls, _)| *calls > 0)
            .collect();
        let failures_by_reason = PluginFailure::KINDS
            .iter()
            .zip(&self.by_reason)
            .map(|(k, n)| (*k, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let mut sorted: Vec<u32> = recent.durations.iter().copied().collect();
        sorted.sort_unstable();
        let at = |q: f64| {
            let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
            sorted.get(i).map(|us| Duration::from_micros(u64::from(*us)))
        };
        PluginStats {
            hooks,
            failures_by_reason,
            p50: at(0.5),
            p99: at(0.99),
            recent_failures: recent.failures.iter().rev().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(ms: u64) -> Call<'static> {
        Call { hook: Hook::Transform, took: Duration::from_millis(ms), event_id: "evt_1", attempt_id: "att_1" }
    }

    #[test]
    fn percentiles_reasons_and_recent_failures() {
        let stats = Stats::default();
        assert_eq!((stats.snapshot().p50, stats.snapshot().p99), (None, None));
        for ms in 1..=100 {
            stats.record(call(ms), None, Vec::new());
        }
        let logs: LogCapture = (0..30).map(|i| ("info", format!("line {i}"))).collect();
        stats.record(call(1), Some(&PluginFailure::Timeout(String::new())), logs);
        let s = stats.snapshot();
        // 101 calls: 1 ms twice, then 2 to 100 ms.
        assert_eq!((s.p50, s.p99), (Some(Duration::from_millis(50)), Some(Duration::from_millis(99))));
        assert_eq!(s.failures_by_reason, [("timeout", 1)]);
        let f = &s.recent_failures[0];
        assert_eq!((f.reason, f.logs.len(), f.logs[0].1.as_str()), ("timeout", FAILURE_LOG_LINES, "line 10"));
        for _ in 0..RECENT_FAILURES + 5 {
            stats.record(call(1), Some(&PluginFailure::Trap("x".into())), Vec::new());
        }
        assert_eq!(stats.snapshot().recent_failures.len(), RECENT_FAILURES);
    }
}
