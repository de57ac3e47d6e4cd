//! Herald's Prometheus metrics, through `prometheus-client`, in the OpenMetrics text format.
//!
//! The hot path touches atomics only: counters and [`DurationHistogram`]s are updated with
//! relaxed adds, and the per-tenant outcome counters are looked up once per partition
//! ([`Metrics::tenant`]), never per delivery. Figures that need a query (queue depth,
//! dead letters, endpoint states, plugin calls) are read at scrape time into a
//! [`Snapshot`] by the `/metrics` handler; this module never touches the store.

mod histogram;
mod outbox;
mod snapshot;

pub use histogram::DurationHistogram;
pub use outbox::{OutboxMetrics, SourceMetrics};
pub use snapshot::{Snapshot, TOP_ENDPOINTS};

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use crate::model::{DeliveryState, EndpointKind};
use crate::plugin::{Hook, PluginFailure};

/// Dead-letter reasons by class (see [`crate::model::DEAD_REASON_CLASSES`]).
pub const DEAD_REASONS: [&str; 8] = crate::model::DEAD_REASON_CLASSES;

/// The node's plain counters, in [`Metrics`] field order: (name without `_total`, help).
const COUNTERS: [(&str, &str); 7] = [
    ("herald_events_accepted", "Events durably accepted"),
    ("herald_deliveries_created", "Deliveries created by fan-out"),
    ("herald_attempts", "Delivery attempts made"),
    ("herald_endpoint_pauses", "Endpoint pauses (429, credentials, TLS)"),
    ("herald_endpoint_disables", "Endpoints disabled"),
    ("herald_leases_recovered", "Abandoned leases recovered"),
    ("herald_fenced_results", "Results refused because the lease was lost"),
];
const GAUGES: [(&str, &str); 4] = [
    ("herald_requests_in_flight", "Webhook requests in flight"),
    ("herald_partitions_held", "Endpoint partitions this node holds"),
    ("herald_partitions", "Partition tasks running on this node"),
    ("herald_cluster_nodes", "Live nodes this node shares the endpoints with, itself included"),
];
const HISTOGRAMS: [(&str, &str, &[f64]); 4] = [
    ("herald_attempt_duration_seconds", "One attempt: transform and sign plugins, the request", histogram::FAST),
    ("herald_arrival_latency_seconds", "From an event's 202 to its delivery, retries included", histogram::ARRIVAL),
    ("herald_intake_commit_duration_seconds", "An intake request's wait for its durable group commit", histogram::FAST),
    ("herald_claim_duration_seconds", "One claim of due deliveries", histogram::FAST),
];

/// Every metric Herald exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The committer's failures and recoveries (`Committer::reporting_to`).
    pub store_health: Arc<crate::store::CommitHealth>,
    pub events_accepted: Counter,
    pub deliveries_created: Counter,
    pub attempts: Counter,
    pub endpoint_pauses: Counter,
    pub endpoint_disables: Counter,
    pub leases_recovered: Counter,
    pub fenced_results: Counter,
    /// Webhook requests in flight on this node.
    pub in_flight: Gauge,
    /// Endpoint partitions this node holds (and paces).
    pub partitions_held: Gauge,
    /// Partition tasks running on this node, holding a lease or lingering idle.
    pub partitions: Gauge,
    /// Live nodes sharing the endpoints, this one included (1 on a store it owns).
    pub cluster_nodes: Gauge,
    /// One attempt, from the first plugin call to the judged outcome.
    pub attempt_duration: DurationHistogram,
    /// From the event's `202` to its delivery (retries included), for delivered deliveries.
    pub arrival_latency: DurationHistogram,
    /// One intake request's wait for its group commit.
    pub intake_commit: DurationHistogram,
    /// One claim of due deliveries (through the group committer).
    pub claim_duration: DurationHistogram,
    plugin_call: [DurationHistogram; 3],
    outcomes: Family<OutcomeLabels, Counter>,
    dead: Family<DeadLabels, Counter>,
    plugin_failures: Family<PluginFailureLabels, Counter>,
    schema_violations: Family<SchemaLabels, Counter>,
    /// The outbox relay's series, per source.
    pub outbox: OutboxMetrics,
    snapshot: snapshot::Shared,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    tenant: String,
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeadLabels {
    tenant: String,
    kind: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginFailureLabels {
    tenant: String,
    plugin: String,
    hook: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SchemaLabels {
    tenant: String,
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    hook: &'static str,
}

type HistogramFamily<S> = Family<S, DurationHistogram, fn() -> DurationHistogram>;

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric; the scrape-time ones read the latest [`Snapshot`].
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        let [
            events_accepted,
            deliveries_created,
            attempts,
            endpoint_pauses,
            endpoint_disables,
            leases_recovered,
            fenced_results,
        ] = COUNTERS.map(|(name, help)| register(&mut r, name, help, Counter::default()));
        let [in_flight, partitions_held, partitions, cluster_nodes] =
            GAUGES.map(|(name, help)| register(&mut r, name, help, Gauge::default()));
        let [attempt_duration, arrival_latency, intake_commit, claim_duration] =
            HISTOGRAMS.map(|(name, help, bounds)| register(&mut r, name, help, DurationHistogram::new(bounds)));
        let fast = || DurationHistogram::new(histogram::FAST);
        let plugin_calls: HistogramFamily<HookLabels> = register(
            &mut r,
            "herald_plugin_call_duration_seconds",
            "Plugin hook calls, queueing on the call pool included",
            Family::new_with_constructor(fast),
        );
        let outcomes = "Attempt results by tenant and destination kind: delivered, retried, dropped (by a transform plugin) or dead";
        let dead = "Deliveries dead-lettered by the engine, by tenant, destination kind and reason";
        let plugin_failures = "Failed plugin calls by tenant, plugin, hook and reason";
        let schema_violations = "Events whose payload failed their catalog schema (or whose type the catalog lacks), \
            by tenant and the tenant's schema_validation: accepted (warn) or refused (enforce)";
        let snapshot = snapshot::Shared::default();
        r.register_collector(Box::new(snapshot.clone()));
        let store_health = Arc::<crate::store::CommitHealth>::default();
        r.register_collector(Box::new(snapshot::StoreHealth(store_health.clone())));
        Metrics {
            store_health,
            events_accepted,
            deliveries_created,
            attempts,
            endpoint_pauses,
            endpoint_disables,
            leases_recovered,
            fenced_results,
            in_flight,
            partitions_held,
            partitions,
            cluster_nodes,
            attempt_duration,
            arrival_latency,
            intake_commit,
            claim_duration,
            plugin_call: Hook::ALL.map(|h| plugin_calls.get_or_create_owned(&HookLabels { hook: h.as_str() })),
            outcomes: register(&mut r, "herald_delivery_outcomes", outcomes, Family::default()),
            dead: register(&mut r, "herald_dead_letters", dead, Family::default()),
            plugin_failures: register(&mut r, "herald_plugin_failures", plugin_failures, Family::default()),
            schema_violations: register(&mut r, "herald_schema_violations", schema_violations, Family::default()),
            outbox: OutboxMetrics::register(&mut r),
            snapshot,
            registry: r,
        }
    }

    /// The counters of `tenant`'s attempt results to destinations of `kind`; look them up
    /// once and keep them, so counting a result is one atomic add.
    pub fn tenant(&self, tenant: &str, kind: EndpointKind) -> TenantCounters {
        let kind = kind.as_str();
        let outcome =
            |outcome| self.outcomes.get_or_create_owned(&OutcomeLabels { tenant: tenant.to_string(), kind, outcome });
        TenantCounters(Arc::new(TenantInner {
            kind,
            delivered: outcome("delivered"),
            retried: outcome("retried"),
            dropped: outcome("dropped"),
            dead: outcome("dead"),
            dead_by: DEAD_REASONS
                .map(|reason| self.dead.get_or_create_owned(&DeadLabels { tenant: tenant.to_string(), kind, reason })),
        }))
    }

    /// Times one call of `hook`.
    pub fn plugin_call(&self, hook: Hook) -> &DurationHistogram {
        &self.plugin_call[Hook::ALL.iter().position(|h| *h == hook).unwrap_or(0)]
    }

    /// Counts an event that failed its tenant's event catalog (`mode`: `warn` or `enforce`).
    /// Rare on a healthy producer, so the label lookup is affordable.
    pub fn schema_violation(&self, tenant: &str, mode: &'static str) {
        self.schema_violations.get_or_create(&SchemaLabels { tenant: tenant.to_string(), mode }).inc();
    }

    /// Counts a failed plugin call. Failures are rare, so the label lookup is affordable.
    pub fn plugin_failed(&self, tenant: &str, plugin: &str, hook: Hook, failure: &PluginFailure) {
        let labels = PluginFailureLabels {
            tenant: tenant.to_string(),
            plugin: plugin.to_string(),
            hook: hook.as_str(),
            reason: failure.kind(),
        };
        self.plugin_failures.get_or_create(&labels).inc();
    }

    /// Replaces the scrape-time figures.
    pub fn set_snapshot(&self, snapshot: Snapshot) {
        self.snapshot.set(snapshot);
    }

    /// When the current snapshot was taken (0: never), so the caller can reuse a fresh one.
    pub fn snapshot_taken_at(&self) -> crate::model::Millis {
        self.snapshot.taken_at()
    }

    /// The exposition in the Prometheus text format (0.0.4), which every scraper and
    /// `promtool` reads.
    pub fn render(&self) -> String {
        let mut open_metrics = String::new();
        prometheus_client::encoding::text::encode(&mut open_metrics, &self.registry)
            .expect("writing to a String cannot fail");
        to_prometheus_text(&open_metrics)
    }
}

/// Registers `metric` (which shares its values with its clones) and returns it.
fn register<M: Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

/// One tenant's outcome counters; clones share them.
#[derive(Clone, Debug)]
pub struct TenantCounters(Arc<TenantInner>);

#[derive(Debug)]
struct TenantInner {
    kind: &'static str,
    delivered: Counter,
    retried: Counter,
    dropped: Counter,
    dead: Counter,
    dead_by: [Counter; DEAD_REASONS.len()],
}

impl TenantCounters {
    /// The destination kind these counters are labelled with.
    pub fn kind(&self) -> &'static str {
        self.0.kind
    }

    /// Counts `n` deliveries of a `poll` endpoint its consumer acknowledged: delivered.
    pub fn acknowledged(&self, n: u64) {
        self.0.delivered.inc_by(n);
    }

    /// Counts a recorded result that left the delivery in `state` (with its dead-letter
    /// `reason`, if dead).
    pub fn settled(&self, state: DeliveryState, reason: Option<&str>) {
        let t = &self.0;
        match state {
            DeliveryState::Delivered => {
                t.delivered.inc();
            }
            DeliveryState::Waiting => {
                t.retried.inc();
            }
            DeliveryState::Dead => {
                let class = dead_class(reason.unwrap_or(""));
                if DEAD_REASONS[class] == "dropped" {
                    t.dropped.inc()
                } else {
                    t.dead.inc()
                };
                t.dead_by[class].inc();
            }
            _ => {}
        }
    }

    /// Counts `n` deliveries dead-lettered together, without an attempt of their own, for
    /// `reason`: the queued deliveries of an endpoint being disabled.
    pub fn dead_lettered(&self, reason: &str, n: u64) {
        self.0.dead_by[dead_class(reason)].inc_by(n);
    }
}

/// Rewrites prometheus-client's OpenMetrics text as Prometheus text 0.0.4: there, a
/// counter family is named with its `_total` suffix, and `# EOF` has no meaning.
fn to_prometheus_text(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        open_metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(open_metrics.len() + 16 * counters.len());
    for line in open_metrics.lines().filter(|l| *l != "# EOF") {
        let mut words = line.splitn(4, ' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some(kind @ ("HELP" | "TYPE")), Some(name), rest) if counters.contains(name) => {
                out.push_str(&format!("# {kind} {name}_total"));
                if let Some(rest) = rest {
                    out.push(' ');
                    out.push_str(rest);
                }
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The index in [`DEAD_REASONS`] of a dead-letter reason's class.
pub fn dead_class(reason: &str) -> usize {
    crate::model::dead_reason_class(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_reasons_fall_into_their_class() {
        for (reason, class) in [
            ("exhausted", "exhausted"),
            ("permanent:404", "permanent"),
            ("plugin:timeout", "plugin"),
            ("dropped", "dropped"),
            ("dropped:spam", "dropped"),
            ("endpoint_disabled", "endpoint_disabled"),
            ("something new", "other"),
        ] {
            assert_eq!(DEAD_REASONS[dead_class(reason)], class, "{reason}");
        }
    }

    #[test]
    fn tenant_counters_move_their_own_series() {
        let m = Metrics::new();
        let acme = m.tenant("acme", EndpointKind::Http);
        acme.settled(DeliveryState::Delivered, None);
        acme.settled(DeliveryState::Dead, Some("permanent:400"));
        acme.settled(DeliveryState::Dead, Some("dropped"));
        m.tenant("acme", EndpointKind::Http).settled(DeliveryState::Waiting, None);
        m.tenant("acme", EndpointKind::Nats).settled(DeliveryState::Delivered, None);
        let text = m.render();
        for line in [
            "herald_delivery_outcomes_total{tenant=\"acme\",kind=\"http\",outcome=\"delivered\"} 1",
            "herald_delivery_outcomes_total{tenant=\"acme\",kind=\"http\",outcome=\"retried\"} 1",
            "herald_delivery_outcomes_total{tenant=\"acme\",kind=\"http\",outcome=\"dead\"} 1",
            "herald_delivery_outcomes_total{tenant=\"acme\",kind=\"http\",outcome=\"dropped\"} 1",
            "herald_delivery_outcomes_total{tenant=\"acme\",kind=\"nats\",outcome=\"delivered\"} 1",
            "herald_dead_letters_total{tenant=\"acme\",kind=\"http\",reason=\"permanent\"} 1",
            "herald_dead_letters_total{tenant=\"acme\",kind=\"http\",reason=\"expired\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }
}
