//! Replays of dead letters, what they select, and endpoint health.

use serde::{Deserialize, Serialize};

use super::{LastError, Millis, TenantId};

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
    /// A replay's: the endpoints whose dead letters it leaves out, not active when it
    /// started (what it could not send), and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedEndpoint>,
}

/// An endpoint whose dead letters a replay leaves out, and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SkippedEndpoint {
    pub endpoint: String,
    /// `paused` or `disabled`.
    pub state: String,
    /// Its `state_reason`.
    #[serde(default)]
    pub reason: Option<String>,
    /// How many of its dead letters the selection held.
    pub dead_letters: u64,
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

/// About how long a turn's worth of a replay takes to send at its rate: a turn re-queues
/// that much (at least one), so little waits re-queued ahead of its sending (a cancel puts
/// it back) and turns stay few at high rates.
pub const TURN_SPAN_MS: Millis = 100;
/// How often a replay that has re-queued its whole selection looks whether all of it has
/// settled (it is `running` until then).
pub const SETTLE_CHECK_MS: Millis = 1_000;

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
    /// Sent per second.
    pub rate_per_sec: f64,
    /// The most re-queued in one turn, and the most re-queued and not yet sent at a time.
    pub batch: u32,
    pub selected: u64,
    /// Re-queued so far (sent or not).
    pub requeued: u64,
    /// The last delivery id re-queued: where a resumed replay continues.
    pub cursor: String,
    /// When its next turn is due: the pace every node running it shares (0: at once).
    pub next_due_at: Millis,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// What a replay's turn does, given how much of what it re-queued is still unsent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnPlan {
    /// Re-queue up to this many more dead letters.
    Requeue(u32),
    /// Nothing before this time: the turn is not due, or `batch` re-queued deliveries
    /// still wait to be sent.
    WaitUntil(Millis),
}

impl Replay {
    /// What a turn at `now` may do while `unsent` of the deliveries it re-queued wait to be
    /// sent: re-queue about [`TURN_SPAN_MS`] of its rate, never leaving more than `batch`
    /// unsent. So the replay's rate is the rate its deliveries go out at (a slow endpoint
    /// slows it), not just the rate they are re-queued at.
    pub fn plan(&self, now: Millis, unsent: u64) -> TurnPlan {
        if self.next_due_at > now {
            return TurnPlan::WaitUntil(self.next_due_at);
        }
        let room = u64::from(self.batch).saturating_sub(unsent);
        if room == 0 {
            return TurnPlan::WaitUntil(now + self.spacing_ms().max(TURN_SPAN_MS as f64) as Millis);
        }
        let per_turn = (self.rate_per_sec * TURN_SPAN_MS as f64 / 1000.0).floor().max(1.0) as u64;
        TurnPlan::Requeue(per_turn.min(room) as u32)
    }

    /// When each of `n` dead letters re-queued at `now` is due, spaced at the replay's
    /// rate, and when the turn after them is.
    pub fn schedule(&self, now: Millis, n: usize) -> (Vec<Millis>, Millis) {
        let spacing_ms = self.spacing_ms();
        let at = |i: usize| now + (i as f64 * spacing_ms) as Millis;
        ((0..n).map(at).collect(), at(n))
    }

    fn spacing_ms(&self) -> f64 {
        1000.0 / self.rate_per_sec
    }
}

/// What became of the deliveries a replay re-queued, read from them. Each is in exactly
/// one of `delivered`, `failed`, `returned` and `pending`, so those add up to
/// [`Replay::requeued`] (less any a later replay took over).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayFigures {
    /// Attempted at least once since the replay re-queued them.
    pub sent: u64,
    pub delivered: u64,
    /// Sent, and dead letters again.
    pub failed: u64,
    /// Dead letters again without being sent: the replay was cancelled first (they are
    /// back as they were), or their endpoint was disabled.
    pub returned: u64,
    /// Not settled yet: waiting to be sent, in flight, or waiting to be retried.
    pub pending: u64,
}

/// A replay with what became of what it re-queued.
#[derive(Debug, Clone)]
pub struct ReplayProgress {
    pub replay: Replay,
    pub figures: ReplayFigures,
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
    /// The latest failed attempt (read with the rest, in the same statement).
    #[serde(skip)]
    pub last_error: Option<LastError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(rate_per_sec: f64, batch: u32, next_due_at: Millis) -> Replay {
        Replay {
            id: "rpl_1".into(),
            tenant: TenantId::from_stored("acme"),
            state: ReplayState::Running,
            ids: None,
            filter: None,
            rate_per_sec,
            batch,
            selected: 1000,
            requeued: 0,
            cursor: String::new(),
            next_due_at,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn a_turn_requeues_a_span_of_its_rate_and_never_more_unsent_than_a_batch() {
        let cases = [
            // (rate, batch, next due, now, unsent, plan)
            (4.0, 100, 0, 0, 0, TurnPlan::Requeue(1)),
            (1000.0, 100, 0, 0, 0, TurnPlan::Requeue(100)),
            (10_000.0, 100, 0, 0, 0, TurnPlan::Requeue(100)),
            (1000.0, 100, 0, 0, 70, TurnPlan::Requeue(30)),
            (200.0, 100, 0, 0, 0, TurnPlan::Requeue(20)),
            // Not due yet: another node took the last turn.
            (4.0, 100, 500, 250, 0, TurnPlan::WaitUntil(500)),
            // A batch waits to be sent: look again after a send's worth of time.
            (4.0, 2, 0, 1000, 2, TurnPlan::WaitUntil(1250)),
            (1000.0, 100, 0, 1000, 100, TurnPlan::WaitUntil(1100)),
        ];
        for (rate, batch, due, now, unsent, want) in cases {
            assert_eq!(replay(rate, batch, due).plan(now, unsent), want, "rate {rate} unsent {unsent}");
        }
    }

    #[test]
    fn a_turn_spaces_what_it_requeues_at_the_rate() {
        let r = replay(4.0, 100, 0);
        assert_eq!(r.schedule(1000, 3), (vec![1000, 1250, 1500], 1750));
        assert_eq!(r.schedule(1000, 0), (vec![], 1000));
    }
}
