//! A histogram of durations made of atomics only. prometheus-client's own `Histogram`
//! takes a lock on every `observe`; these are observed once or more per delivery, on the
//! hot path, so they stay lock-free (a relaxed add per bucket, count and sum).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Upper bounds, in seconds, of an attempt, a commit, a claim or a plugin call: 1 ms to 30 s.
pub const FAST: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Upper bounds, in seconds, of an event's wait from `202` to its arrival: 10 ms to 24 h
/// (retries and backoff included).
pub const ARRIVAL: &[f64] =
    &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0];

/// A cumulative histogram of durations; clones share the same counts.
#[derive(Clone, Debug)]
pub struct DurationHistogram(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Upper bounds in microseconds, ascending; the `+Inf` bucket is implied.
    bounds_us: Box<[u64]>,
    bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts; one more than `bounds`, for `+Inf`.
    counts: Box<[AtomicU64]>,
    sum_us: AtomicU64,
}

impl DurationHistogram {
    /// A histogram with `bounds` (seconds, ascending).
    pub fn new(bounds: &'static [f64]) -> DurationHistogram {
        DurationHistogram(Arc::new(Inner {
            bounds_us: bounds.iter().map(|b| (b * 1e6) as u64).collect(),
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }))
    }

    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = self.0.bounds_us.partition_point(|b| *b < us);
        self.0.counts[i].fetch_add(1, Ordering::Relaxed);
        self.0.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Awaits `f`, counting how long it took.
    pub async fn time<F: std::future::Future>(&self, f: F) -> F::Output {
        let clock = std::time::Instant::now();
        let out = f.await;
        self.observe(clock.elapsed());
        out
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        // Read the buckets first and derive the count from them, so `_count` always equals
        // the `+Inf` bucket even while observations land.
        let buckets: Vec<(f64, u64)> = self
            .0
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.0.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = DurationHistogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_micros(1_000));
        h.observe(Duration::from_micros(1_001));
        h.observe(Duration::from_secs(5));
        let counts: Vec<u64> = h.0.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, [1, 1, 1]);
        assert_eq!(h.count(), 3);
        assert_eq!(h.0.sum_us.load(Ordering::Relaxed), 5_002_001);
    }
}
