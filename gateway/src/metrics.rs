//! Counters and gauges, rendered in the Prometheus text format. Lock-free atomics only.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Every metric Herald exports.
#[derive(Debug, Default)]
pub struct Metrics {
    pub events_accepted: Counter,
    pub deliveries_created: Counter,
    pub attempts: Counter,
    pub delivered: Counter,
    pub retries_scheduled: Counter,
    pub dead_lettered: Counter,
    pub endpoint_pauses: Counter,
    pub endpoint_disables: Counter,
    pub leases_recovered: Counter,
    pub fenced_results: Counter,
    pub plugin_failures: Counter,
    pub in_flight: Counter,
    pub in_flight_done: Counter,
    /// Endpoint partitions started and ended on this node (their difference is a gauge).
    pub partitions_started: Counter,
    pub partitions_ended: Counter,
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &Counter); 11] = [
            ("herald_events_accepted_total", "Events durably accepted", &self.events_accepted),
            ("herald_deliveries_created_total", "Deliveries created by fan-out", &self.deliveries_created),
            ("herald_attempts_total", "Delivery attempts made", &self.attempts),
            ("herald_deliveries_delivered_total", "Deliveries that ended delivered", &self.delivered),
            ("herald_retries_scheduled_total", "Retries scheduled", &self.retries_scheduled),
            ("herald_dead_letters_total", "Deliveries moved to the dead-letter queue", &self.dead_lettered),
            ("herald_endpoint_pauses_total", "Endpoint pauses (429, credentials, TLS)", &self.endpoint_pauses),
            ("herald_endpoint_disables_total", "Endpoints disabled", &self.endpoint_disables),
            ("herald_leases_recovered_total", "Abandoned leases recovered", &self.leases_recovered),
            ("herald_fenced_results_total", "Results refused because the lease was lost", &self.fenced_results),
            ("herald_plugin_failures_total", "Plugin calls that failed", &self.plugin_failures),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", c.get());
        }
        let in_flight = self.in_flight.get().saturating_sub(self.in_flight_done.get());
        let _ = writeln!(
            out,
            "# HELP herald_requests_in_flight Webhook requests in flight\n# TYPE herald_requests_in_flight gauge\nherald_requests_in_flight {in_flight}"
        );
        let partitions = self.partitions_started.get().saturating_sub(self.partitions_ended.get());
        let _ = writeln!(
            out,
            "# HELP herald_partitions Endpoint partitions running on this node\n# TYPE herald_partitions gauge\nherald_partitions {partitions}"
        );
        out
    }
}
