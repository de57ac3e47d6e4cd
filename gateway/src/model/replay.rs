//! Replays of dead letters, what they select, and endpoint health.

use serde::{Deserialize, Serialize};

use super::{Millis, TenantId};

/// Which dead letters a replay (or a dead-letter listing) selects.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Dead since (RFC 3339 in the API, milliseconds here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Millis>,
}

/// Where a replay stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplayState {
    Running,
    Done,
    Cancelled,
}

impl ReplayState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayState::Running => "running",
            ReplayState::Done => "done",
            ReplayState::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [ReplayState::Running, ReplayState::Done, ReplayState::Cancelled].into_iter().find(|x| x.as_str() == s)
    }
}

/// A durable, resumable re-delivery of selected dead letters.
#[derive(Debug, Clone)]
pub struct Replay {
    pub id: String,
    pub tenant: TenantId,
    pub state: ReplayState,
    /// Explicit delivery ids, or …
    pub ids: Option<Vec<String>>,
    /// … a filter.
    pub filter: Option<DeadLetterFilter>,
    pub rate_per_sec: f64,
    pub batch: u32,
    pub selected: u64,
    pub sent: u64,
    /// The last delivery id re-queued: where a resumed replay continues.
    pub cursor: String,
    /// When its next batch is due: the pace every node running it shares (0: at once).
    pub next_due_at: Millis,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl Replay {
    /// When each of `n` dead letters re-queued at `now` is due, spaced at the replay's
    /// rate, and when the batch after them is.
    pub fn schedule(&self, now: Millis, n: usize) -> (Vec<Millis>, Millis) {
        let spacing_ms = 1000.0 / self.rate_per_sec;
        let at = |i: usize| now + (i as f64 * spacing_ms) as Millis;
        ((0..n).map(at).collect(), at(n))
    }
}

/// A replay with the outcome of what it re-queued.
#[derive(Debug, Clone)]
pub struct ReplayProgress {
    pub replay: Replay,
    pub delivered: u64,
    pub failed: u64,
}

/// An endpoint's recent delivery health.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Health {
    pub attempts_1h: u64,
    pub successes_1h: u64,
    pub attempts_24h: u64,
    pub successes_24h: u64,
    pub last_success_at: Option<Millis>,
    pub last_attempt_at: Option<Millis>,
    pub backlog: u64,
    pub dead_letters: u64,
}
