//! Figures read at scrape time (store queries, plugin host counters), kept as the latest
//! [`Snapshot`] and encoded by a collector. The `/metrics` handler refreshes the snapshot at
//! most once a second, so a tight scrape loop never turns into a query loop.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::model::Millis;
use crate::plugin::PluginMetrics;
use crate::store::{CommitHealth, QueueStats};

/// How many endpoints get their own due-deliveries series: the ones with the most due
/// work. Endpoints can number in the hundred thousands; this keeps the series bounded.
pub const TOP_ENDPOINTS: u32 = 20;

/// What the scrape-time gauges show.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// When it was read (the ages below are relative to it).
    pub taken_at: Millis,
    pub queue: QueueStats,
    /// Warm plugin instances (each holds a pooling-allocator slot).
    pub plugin_instances: u64,
    /// Calls of every plugin hook since start.
    pub plugins: Vec<PluginMetrics>,
    /// (tenant, plugin, p50, p99) in seconds over each plugin's latest calls.
    pub plugin_latency: Vec<(String, String, f64, f64)>,
}

/// The latest snapshot, shared by the metrics and their collector.
#[derive(Clone, Debug, Default)]
pub(super) struct Shared(Arc<Mutex<Option<Snapshot>>>);

impl Shared {
    pub(super) fn set(&self, s: Snapshot) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    pub(super) fn taken_at(&self) -> Millis {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, |s| s.taken_at)
    }
}

impl Collector for Shared {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = guard.as_ref() else { return Ok(()) };
        let q = &s.queue;
        let age = |at: Millis| (s.taken_at.saturating_sub(at)).max(0) as f64 / 1000.0;
        gauge(&mut e, "herald_due_deliveries", "Deliveries due now and not yet claimed (queue depth)", q.due as f64)?;
        gauge(
            &mut e,
            "herald_oldest_due_age_seconds",
            "How long the oldest due delivery has been due (0 when none is)",
            q.oldest_due.map_or(0.0, age),
        )?;
        let rows = q.top_due.iter().map(|(t, ep, n)| ([("tenant", t.as_str()), ("endpoint", ep.as_str())], *n as f64));
        gauges(&mut e, "herald_endpoint_due_deliveries", "Due deliveries of the endpoints with the most", rows)?;
        let rows = q.dead.iter().map(|(t, _, n)| ([("tenant", t.as_str())], *n as f64));
        gauges(&mut e, "herald_dead_letters_stored", "Dead letters kept, by tenant", rows)?;
        let rows = q.dead.iter().map(|(t, oldest, _)| ([("tenant", t.as_str())], age(*oldest)));
        gauges(&mut e, "herald_dead_letters_oldest_age_seconds", "Age of the oldest dead letter, by tenant", rows)?;
        let rows = q.endpoints_by_state.iter().map(|(state, n)| ([("state", state.as_str())], *n as f64));
        gauges(&mut e, "herald_endpoints", "Endpoints by state (active, paused, disabled)", rows)?;
        if let Some(wal) = q.wal_bytes {
            gauge(&mut e, "herald_sqlite_wal_bytes", "Size of the SQLite write-ahead log", wal as f64)?;
        }
        gauge(&mut e, "herald_plugin_instances", "Warm plugin instances", s.plugin_instances as f64)?;
        let mut m = e.encode_descriptor(
            "herald_plugin_calls",
            "Plugin hook calls by tenant, plugin and hook",
            None,
            MetricType::Counter,
        )?;
        for p in &s.plugins {
            let labels = [("tenant", p.tenant.as_str()), ("plugin", p.name.as_str()), ("hook", p.hook.as_str())];
            ConstCounter::new(p.calls).encode(m.encode_family(&labels)?)?;
        }
        for (name, help, pick) in [
            ("herald_plugin_call_p50_seconds", "Median plugin call time over its latest 1024 calls", 0),
            ("herald_plugin_call_p99_seconds", "99th percentile plugin call time over its latest 1024 calls", 1),
        ] {
            let rows = s.plugin_latency.iter().map(|(t, p, p50, p99)| {
                ([("tenant", t.as_str()), ("plugin", p.as_str())], if pick == 0 { *p50 } else { *p99 })
            });
            gauges(&mut e, name, help, rows)?;
        }
        Ok(())
    }
}

fn gauge(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: f64) -> Result<(), std::fmt::Error> {
    let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

fn gauges<L: EncodeLabelSet>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (L, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The committer's failed writes and recoveries ([`CommitHealth`]), read at each scrape:
/// they change while the store is down, when the snapshot cannot be refreshed.
#[derive(Debug)]
pub(super) struct StoreHealth(pub(super) Arc<CommitHealth>);

impl Collector for StoreHealth {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (name, help, value) in [
            ("herald_store_write_failures", "Writes the store failed (database down or refusing)", self.0.failures()),
            ("herald_store_recoveries", "Times the store took writes again after failing", self.0.recoveries()),
            (
                "herald_store_refused_untried",
                "Intake requests answered 503 at once while the store could not be reached",
                self.0.refused_untried(),
            ),
        ] {
            let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(m)?;
        }
        Ok(())
    }
}
