//! Lease decisions: how many deliveries a partition claims at once and how long it holds
//! them. Pure: `now` comes in, nothing is read from a clock.

use std::time::Duration;

use crate::model::Millis;

/// The most deliveries one claim takes.
pub const MAX_CLAIM: u32 = 512;

/// How many deliveries an endpoint partition should claim: about one second of its paced
/// rate, at least its in-flight cap plus its burst, never more than `MAX_CLAIM`.
pub fn claim_size(rate_per_sec: f64, burst: u32, max_in_flight: u32) -> u32 {
    let per_second = rate_per_sec.ceil().min(f64::from(MAX_CLAIM)) as u32;
    per_second.max(max_in_flight.saturating_add(burst)).clamp(1, MAX_CLAIM)
}

/// When a lease on `claimed` deliveries must end: the time to send them all at the paced
/// rate, plus the request deadline, plus a safety margin. A lease always outlives the
/// request it covers, so a live worker never loses a delivery it is sending.
pub fn lease_until(now: Millis, claimed: u32, rate_per_sec: f64, timeout: Duration, margin: Duration) -> Millis {
    let drain_ms = (f64::from(claimed) / rate_per_sec.max(f64::MIN_POSITIVE) * 1000.0).ceil();
    let drain_ms = drain_ms.min(86_400_000.0) as i64;
    now.saturating_add(drain_ms).saturating_add(timeout.as_millis() as i64).saturating_add(margin.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_sizes() {
        let cases =
            [(10.0, 10, 4, 14), (1000.0, 10, 4, 512), (0.5, 1, 1, 2), (100.0, 1, 4, 100), (1e9, 1, 1, MAX_CLAIM)];
        for (rate, burst, cap, want) in cases {
            assert_eq!(claim_size(rate, burst, cap), want, "{rate} {burst} {cap}");
        }
    }

    #[test]
    fn leases_outlive_the_drain_and_the_request() {
        let t = Duration::from_secs(10);
        let m = Duration::from_secs(30);
        assert_eq!(lease_until(1_000, 10, 10.0, t, m), 1_000 + 1_000 + 10_000 + 30_000);
        assert_eq!(lease_until(0, 0, 10.0, t, m), 40_000);
        // Absurdly slow rates are capped rather than overflowing.
        assert!(lease_until(0, 512, 1e-9, t, m) <= 86_400_000 + 40_000);
    }
}
