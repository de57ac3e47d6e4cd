//! Time, read only here: the wall clock, and [`Clock`], the one the engine and the API run
//! on, which `tokio::time::pause()` controls. Policies get `now` passed in.
//!
//! [`Clock`] reads the wall clock once at start and then follows tokio's clock, so
//! `tokio::time::pause()` moves stored times and timers together; it owns the `Millis` ↔
//! `Instant` conversions. `clippy.toml` refuses `SystemTime::now` elsewhere.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::model::Millis;
pub use crate::model::rfc3339;

/// Wall time in milliseconds that advances with tokio's clock: the wall clock is read once,
/// when the clock is made, and tokio's monotonic clock counts from there. So a paused
/// runtime (`tokio::time::pause`, `advance`) moves both the stored times Herald writes
/// (`Millis`) and its timers (`Instant`) together, and a test can step through hours of
/// backoff, pauses and lingering in no time. It also owns the conversions between the two.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_start: Millis,
    start: Instant,
}

impl Clock {
    /// A clock that reads the wall time now and follows tokio's clock from here.
    pub fn new() -> Clock {
        Clock::starting_at(now_ms())
    }

    /// A clock that reads `wall` now (tests: a fixed, readable start).
    pub fn starting_at(wall: Millis) -> Clock {
        Clock { wall_at_start: wall, start: Instant::now() }
    }

    /// Milliseconds since the Unix epoch.
    pub fn now(&self) -> Millis {
        self.millis_at(Instant::now())
    }

    /// What this clock reads at `t`.
    pub fn millis_at(&self, t: Instant) -> Millis {
        let since = t.saturating_duration_since(self.start).as_millis();
        self.wall_at_start.saturating_add(i64::try_from(since).unwrap_or(i64::MAX))
    }

    /// The instant at which this clock reads `at` (now, if that has passed).
    pub fn instant_at(&self, at: Millis) -> Instant {
        let now = Instant::now();
        let ahead = at.saturating_sub(self.millis_at(now)).max(0);
        now + Duration::from_millis(ahead as u64)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_a_paused_runtime() {
        let clock = Clock::starting_at(1_000);
        assert_eq!(clock.now(), 1_000);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(clock.now(), 1_000 + 3_600_000, "an hour passes in no time");
        let at = clock.instant_at(clock.now() + 250);
        assert_eq!(at - Instant::now(), Duration::from_millis(250));
        assert_eq!(clock.millis_at(at), clock.now() + 250);
        assert_eq!(clock.instant_at(0), Instant::now(), "a time past is now");
    }
}
