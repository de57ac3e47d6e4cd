//! Per-endpoint pacing: a GCRA token bucket scheduled on absolute deadlines, a cap on
//! in-flight requests, and a pause. Pure policy: it must not read the clock (every `now` is
//! passed in), sleep, or know about HTTP; the caller waits and then polls again.

use std::time::Duration;

use tokio::time::Instant;

/// Highest accepted `rate_per_sec`.
pub const MAX_RATE_PER_SEC: f64 = 100_000.0;

/// Pacing state of one endpoint partition.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Emission interval `T = 1 / rate`.
    interval: Duration,
    /// Burst tolerance `(burst - 1) × T`.
    tolerance: Duration,
    burst: u32,
    max_in_flight: u32,
    in_flight: u32,
    /// Theoretical arrival time of the next send; `None` until the first send.
    tat: Option<Instant>,
    paused_until: Option<Instant>,
}

/// The answer to "may I send one request now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Send now; the caller must call [`Pacer::release`] when the request ends.
    Go,
    /// The bucket is empty: poll again at this instant.
    WaitUntil(Instant),
    /// `max_in_flight` requests are running: poll again after a release.
    Full,
    /// The endpoint is paused until this instant.
    Paused(Instant),
}

/// A rejected pacing configuration. It says the reason; [`PaceError::field`] names the
/// setting, which the caller puts before it (`rate_per_sec: …`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PaceError {
    /// The rate was not a finite number in `(0, MAX_RATE_PER_SEC]`, or too small to represent.
    #[error("must be a finite number in (0, {MAX_RATE_PER_SEC}], got {0}")]
    InvalidRate(f64),
    /// `burst` was zero.
    #[error("must be at least 1")]
    ZeroBurst,
    /// `burst` intervals at this rate do not fit in a `Duration`.
    #[error("{burst} at {rate} per second spans too long a window")]
    BurstTooLong {
        /// The rejected burst.
        burst: u32,
        /// The rate it was combined with.
        rate: f64,
    },
    /// `max_in_flight` was zero.
    #[error("must be at least 1")]
    ZeroMaxInFlight,
}

impl PaceError {
    /// The setting at fault: `rate_per_sec`, `burst` or `max_in_flight`.
    pub fn field(&self) -> &'static str {
        match self {
            PaceError::InvalidRate(_) => "rate_per_sec",
            PaceError::ZeroBurst | PaceError::BurstTooLong { .. } => "burst",
            PaceError::ZeroMaxInFlight => "max_in_flight",
        }
    }
}

/// How far behind schedule a send may be and still keep the schedule's cadence: the
/// resolution of the runtime's timers.
pub const TIMER_SLACK: Duration = Duration::from_millis(5);

impl Pacer {
    /// Validates and builds an idle, unpaused pacer.
    pub fn try_new(rate_per_sec: f64, burst: u32, max_in_flight: u32) -> Result<Self, PaceError> {
        let (interval, tolerance) = bucket(rate_per_sec, burst, max_in_flight)?;
        Ok(Self { interval, tolerance, burst, max_in_flight, in_flight: 0, tat: None, paused_until: None })
    }

    /// Asks to send one request at `now`. On [`Permit::Go`] the send is counted both in the
    /// bucket and in flight.
    pub fn poll(&mut self, now: Instant) -> Permit {
        if let Some(until) = self.paused_until {
            if now < until {
                return Permit::Paused(until);
            }
            self.paused_until = None;
        }
        if self.in_flight >= self.max_in_flight {
            return Permit::Full;
        }
        let tat = self.current_tat(now);
        let earliest = sub(tat, self.tolerance, now);
        if earliest > now {
            self.tat = Some(tat);
            return Permit::WaitUntil(earliest);
        }
        self.tat = Some(add(self.schedule_base(tat, now), self.interval));
        self.in_flight += 1;
        Permit::Go
    }

    /// Marks one request as finished.
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Pauses sending until `until`, or later if a later pause is already set.
    pub fn pause_until(&mut self, until: Instant) {
        self.paused_until = Some(self.paused_until.map_or(until, |u| u.max(until)));
    }

    /// Lifts any pause immediately.
    pub fn resume(&mut self) {
        self.paused_until = None;
    }

    /// The pause deadline, if one is set. A pause that has passed is cleared by the next
    /// [`Pacer::poll`]; use [`Pacer::is_paused`] to ask about a given instant.
    pub fn paused_until(&self) -> Option<Instant> {
        self.paused_until
    }

    /// Whether sending is paused at `now`.
    pub fn is_paused(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|u| now < u)
    }

    /// Requests currently in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Configured burst size.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Configured in-flight cap.
    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }

    /// Emission interval `1 / rate_per_sec`.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Applies new limits, keeping the requests in flight and any pause. Debt accumulated at
    /// a slower rate is trimmed on the next poll to an empty bucket at the new rate, so
    /// speeding up takes effect within one new interval.
    pub fn reconfigure(&mut self, rate_per_sec: f64, burst: u32, max_in_flight: u32) -> Result<(), PaceError> {
        let (interval, tolerance) = bucket(rate_per_sec, burst, max_in_flight)?;
        self.interval = interval;
        self.tolerance = tolerance;
        self.burst = burst;
        self.max_in_flight = max_in_flight;
        Ok(())
    }

    /// The stored TAT, or `now` when idle, never more than one full bucket ahead of `now`.
    /// The bound is a no-op in steady state (a send never sets TAT beyond
    /// `now + tolerance + T`) and only trims debt left over from a slower configuration.
    fn current_tat(&self, now: Instant) -> Instant {
        let tat = self.tat.unwrap_or(now);
        tat.min(add(add(now, self.tolerance), self.interval))
    }

    /// Where the next interval starts after a send at `now`. Standard GCRA restarts from
    /// `max(tat, now)`, which makes a caller that wakes a little after its `WaitUntil` push
    /// every later send later (with `burst = 1` the rate drops by the wake-up latency). So
    /// a send less than half an interval behind schedule keeps the schedule's cadence;
    /// anything later counts as idle and restarts from `now`, exactly like GCRA. Timers
    /// wake up to a millisecond late, so at high rates (intervals near 1 ms) up to
    /// `TIMER_SLACK` of lag is kept too: the long-run rate stays exact, at the price of at
    /// most `TIMER_SLACK / interval` extra sends catching up in one instant.
    fn schedule_base(&self, tat: Instant, now: Instant) -> Instant {
        let floor = sub(now, (self.interval / 2).max(TIMER_SLACK), now);
        if tat >= floor { tat } else { now }
    }
}

/// Validates a configuration and returns `(interval, tolerance)`.
fn bucket(rate: f64, burst: u32, max_in_flight: u32) -> Result<(Duration, Duration), PaceError> {
    if !(rate > 0.0 && rate <= MAX_RATE_PER_SEC) {
        return Err(PaceError::InvalidRate(rate));
    }
    if burst == 0 {
        return Err(PaceError::ZeroBurst);
    }
    if max_in_flight == 0 {
        return Err(PaceError::ZeroMaxInFlight);
    }
    let interval = Duration::try_from_secs_f64(1.0 / rate).map_err(|_| PaceError::InvalidRate(rate))?;
    let tolerance =
        interval.checked_mul(burst).map(|_| interval * (burst - 1)).ok_or(PaceError::BurstTooLong { burst, rate })?;
    Ok((interval, tolerance))
}

/// `t + d`, saturating at `t` on overflow (only reachable with absurd configurations).
fn add(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).unwrap_or(t)
}

/// `t - d`, or `fallback` if that instant is not representable.
fn sub(t: Instant, d: Duration, fallback: Instant) -> Instant {
    t.checked_sub(d).unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A fixed origin; tests only ever add to it.
    fn t0() -> Instant {
        Instant::now()
    }

    /// Polls at `now` until the pacer stops saying `Go`; returns how many went.
    fn drain(p: &mut Pacer, now: Instant) -> u32 {
        let mut n = 0;
        while p.poll(now) == Permit::Go {
            p.release();
            n += 1;
        }
        n
    }

    /// Runs a caller that sends whenever allowed, releases at once, and sleeps until each
    /// `WaitUntil` plus `late`. Returns the number of sends in `[start, start + span)`.
    fn simulate(p: &mut Pacer, start: Instant, span: Duration, late: Duration) -> u64 {
        let end = start + span;
        let mut now = start;
        let mut sent = 0;
        while now < end {
            match p.poll(now) {
                Permit::Go => {
                    p.release();
                    sent += 1;
                }
                Permit::WaitUntil(t) => now = t + late,
                other => panic!("unexpected {other:?}"),
            }
        }
        sent
    }

    #[test]
    fn constructor_validates() {
        assert!(Pacer::try_new(10.0, 1, 4).is_ok());
        assert!(Pacer::try_new(MAX_RATE_PER_SEC, 1, 1).is_ok());
        assert!(Pacer::try_new(0.001, 100, 1).is_ok());
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_RATE_PER_SEC * 2.0, 1e-300] {
            assert!(matches!(Pacer::try_new(rate, 1, 1), Err(PaceError::InvalidRate(_))), "{rate}");
        }
        assert_eq!(Pacer::try_new(1.0, 0, 1).unwrap_err(), PaceError::ZeroBurst);
        assert_eq!(Pacer::try_new(1.0, 1, 0).unwrap_err(), PaceError::ZeroMaxInFlight);
        let long = Pacer::try_new(1e-10, u32::MAX, 1).unwrap_err();
        assert!(matches!(long, PaceError::BurstTooLong { .. }));
    }

    #[test]
    fn burst_then_paced() {
        let start = t0();
        let mut p = Pacer::try_new(10.0, 5, 100).unwrap();
        assert_eq!(drain(&mut p, start), 5);
        // The sixth send is due one interval after the first.
        assert_eq!(p.poll(start), Permit::WaitUntil(start + ms(100)));
        assert_eq!(p.poll(start + ms(99)), Permit::WaitUntil(start + ms(100)));
        assert_eq!(p.poll(start + ms(100)), Permit::Go);
        assert_eq!(p.poll(start + ms(100)), Permit::WaitUntil(start + ms(200)));
        // An idle second refills the bucket to `burst`, never beyond.
        assert_eq!(drain(&mut p, start + ms(1100)), 5);
        assert_eq!(drain(&mut p, start + ms(10_000)), 5);
    }

    #[test]
    fn burst_one_spaces_every_send() {
        let start = t0();
        let mut p = Pacer::try_new(4.0, 1, 10).unwrap();
        assert_eq!(drain(&mut p, start), 1);
        assert_eq!(p.poll(start), Permit::WaitUntil(start + ms(250)));
        assert_eq!(drain(&mut p, start + ms(250)), 1);
        // Very late (idle): still only one.
        assert_eq!(drain(&mut p, start + ms(5_000)), 1);
    }

    #[test]
    fn in_flight_cap() {
        let start = t0();
        let mut p = Pacer::try_new(1000.0, 10, 2).unwrap();
        assert_eq!(p.poll(start), Permit::Go);
        assert_eq!(p.poll(start), Permit::Go);
        assert_eq!(p.in_flight(), 2);
        assert_eq!(p.poll(start + ms(50)), Permit::Full);
        p.release();
        assert_eq!(p.in_flight(), 1);
        assert_eq!(p.poll(start + ms(50)), Permit::Go);
        assert_eq!(p.poll(start + ms(50)), Permit::Full);
        for _ in 0..5 {
            p.release();
        }
        assert_eq!(p.in_flight(), 0, "release saturates");
    }

    #[test]
    fn full_does_not_consume_a_token() {
        let start = t0();
        let mut p = Pacer::try_new(1.0, 2, 1).unwrap();
        assert_eq!(p.poll(start), Permit::Go);
        assert_eq!(p.poll(start), Permit::Full);
        p.release();
        assert_eq!(p.poll(start), Permit::Go, "second burst token still there");
    }

    #[test]
    fn pause_stops_everything_until_its_instant() {
        let start = t0();
        let mut p = Pacer::try_new(100.0, 3, 1).unwrap();
        p.pause_until(start + ms(60_000));
        assert_eq!(p.paused_until(), Some(start + ms(60_000)));
        assert!(p.is_paused(start));
        let paused = Permit::Paused(start + ms(60_000));
        assert_eq!(p.poll(start), paused);
        assert_eq!(p.poll(start + ms(59_999)), paused);
        // An earlier pause does not shorten it; a later one extends it.
        p.pause_until(start + ms(1_000));
        assert_eq!(p.poll(start + ms(59_999)), paused);
        p.pause_until(start + ms(61_000));
        assert_eq!(p.poll(start + ms(60_000)), Permit::Paused(start + ms(61_000)));
        assert_eq!(p.poll(start + ms(61_000)), Permit::Go);
        assert_eq!(p.paused_until(), None, "an expired pause is cleared");
        assert!(!p.is_paused(start + ms(61_000)));
    }

    #[test]
    fn pause_takes_precedence_over_full() {
        let start = t0();
        let mut p = Pacer::try_new(100.0, 3, 1).unwrap();
        assert_eq!(p.poll(start), Permit::Go);
        p.pause_until(start + ms(10));
        assert_eq!(p.poll(start), Permit::Paused(start + ms(10)));
        assert_eq!(p.in_flight(), 1);
    }

    #[test]
    fn resume_lifts_the_pause() {
        let start = t0();
        let mut p = Pacer::try_new(100.0, 3, 4).unwrap();
        p.pause_until(start + ms(60_000));
        p.resume();
        assert_eq!(p.paused_until(), None);
        assert_eq!(p.poll(start), Permit::Go);
    }

    #[test]
    fn after_a_pause_the_burst_is_not_exceeded() {
        let start = t0();
        let mut p = Pacer::try_new(100.0, 5, 1_000).unwrap();
        assert_eq!(drain(&mut p, start), 5);
        p.pause_until(start + ms(60_000));
        assert_eq!(drain(&mut p, start + ms(30_000)), 0);
        // A minute of credit has "accrued" during the pause; only `burst` is spendable.
        assert_eq!(drain(&mut p, start + ms(60_000)), 5);
        let resumed = start + ms(60_000);
        assert_eq!(p.poll(resumed), Permit::WaitUntil(resumed + ms(10)));
        // And the paced rate continues from there.
        assert_eq!(simulate(&mut p, resumed + ms(10), ms(1_000), Duration::ZERO), 100);
    }

    #[test]
    fn exact_long_run_rate_with_late_wakeups() {
        let late = Duration::from_micros(300);
        // (rate, burst, span) → expected sends in the span, ±0.1 %.
        let cases = [
            (100.0, 1, 10_000, 1_000),
            (100.0, 10, 10_000, 1_009),
            (1000.0, 1, 10_000, 10_000),
            (1000.0, 50, 10_000, 10_049),
            (10.0, 1, 10_000, 100),
            (10.0, 3, 100_000, 1_002),
            (3.0, 1, 100_000, 300),
        ];
        for (rate, burst, span_ms, want) in cases {
            let mut p = Pacer::try_new(rate, burst, 1).unwrap();
            let got = simulate(&mut p, t0(), ms(span_ms), late);
            let tol = (want as f64 * 0.001).max(1.0);
            assert!((got as f64 - want as f64).abs() <= tol, "rate {rate} burst {burst}: {got}");
        }
    }

    #[test]
    fn on_time_wakeups_give_the_exact_rate() {
        for (rate, want) in [(100.0, 1_000), (1000.0, 10_000), (10.0, 100), (7.0, 70)] {
            let mut p = Pacer::try_new(rate, 1, 1).unwrap();
            assert_eq!(simulate(&mut p, t0(), ms(10_000), Duration::ZERO), want, "rate {rate}");
        }
    }

    #[test]
    fn slight_lateness_keeps_cadence_and_long_lateness_restarts() {
        let start = t0();
        let mut p = Pacer::try_new(10.0, 1, 1).unwrap();
        assert_eq!(drain(&mut p, start), 1);
        // 40 ms late for the 100 ms slot: the cadence is kept.
        assert_eq!(drain(&mut p, start + ms(140)), 1);
        assert_eq!(p.poll(start + ms(140)), Permit::WaitUntil(start + ms(200)));
        // 80 ms late for the 200 ms slot: counts as idle, the next slot is a full interval on.
        assert_eq!(drain(&mut p, start + ms(280)), 1);
        assert_eq!(p.poll(start + ms(280)), Permit::WaitUntil(start + ms(380)));
    }

    #[test]
    fn reconfigure_applies_new_limits_and_keeps_state() {
        let start = t0();
        let mut p = Pacer::try_new(1.0, 1, 2).unwrap();
        assert_eq!(p.poll(start), Permit::Go);
        p.pause_until(start + ms(500));
        p.reconfigure(100.0, 2, 1).unwrap();
        assert_eq!(p.in_flight(), 1);
        assert_eq!(p.paused_until(), Some(start + ms(500)));
        assert_eq!((p.burst(), p.max_in_flight(), p.interval()), (2, 1, ms(10)));
        assert_eq!(p.poll(start + ms(500)), Permit::Full, "new in-flight cap");
        p.release();
        // The old 1 s debt shrinks to an empty bucket at the new rate: one new interval.
        assert_eq!(p.poll(start + ms(500)), Permit::WaitUntil(start + ms(510)));
        assert_eq!(drain(&mut p, start + ms(510)), 1);
        assert_eq!(p.poll(start + ms(510)), Permit::WaitUntil(start + ms(520)));
    }

    #[test]
    fn reconfigure_rejects_bad_values_and_keeps_old_ones() {
        let mut p = Pacer::try_new(10.0, 3, 4).unwrap();
        assert_eq!(p.reconfigure(0.0, 3, 4), Err(PaceError::InvalidRate(0.0)));
        assert_eq!(p.reconfigure(10.0, 0, 4), Err(PaceError::ZeroBurst));
        assert_eq!(p.reconfigure(10.0, 3, 0), Err(PaceError::ZeroMaxInFlight));
        assert_eq!((p.burst(), p.max_in_flight(), p.interval()), (3, 4, ms(100)));
    }

    #[test]
    fn slowing_down_applies_from_the_next_send() {
        let start = t0();
        let mut p = Pacer::try_new(100.0, 1, 10).unwrap();
        assert_eq!(drain(&mut p, start), 1);
        p.reconfigure(1.0, 1, 10).unwrap();
        assert_eq!(drain(&mut p, start + ms(10)), 1);
        assert_eq!(p.poll(start + ms(10)), Permit::WaitUntil(start + ms(1_010)));
    }
}
