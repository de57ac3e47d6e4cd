//! The outbox relay's series, one label set per configured `[[outbox]]` source (bounded by
//! the config): rows relayed, rows parked, re-ingested duplicates, and the backlog the
//! relay measures on the producer's clock.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::register;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

/// The families; [`OutboxMetrics::source`] hands out one source's series.
#[derive(Debug)]
pub struct OutboxMetrics {
    relayed: Family<SourceLabels, Counter>,
    parked: Family<SourceLabels, Counter>,
    duplicates: Family<SourceLabels, Counter>,
    lag: Family<SourceLabels, Gauge<f64, AtomicU64>>,
    pending: Family<SourceLabels, Gauge>,
    parked_rows: Family<SourceLabels, Gauge>,
}

/// One source's series (clones share the values).
#[derive(Debug, Clone)]
pub struct SourceMetrics {
    /// Rows ingested and deleted from the outbox by this node.
    pub relayed: Counter,
    /// Rows this node parked (validation refused them).
    pub parked: Counter,
    /// Rows whose ingest found the event already stored (re-read after a crash, or a
    /// producer reusing an id with the same content).
    pub duplicates: Counter,
    /// Age in seconds of the oldest unrelayed row (0 when none is waiting).
    pub lag_seconds: Gauge<f64, AtomicU64>,
    pub pending_rows: Gauge,
    pub parked_rows: Gauge,
}

impl OutboxMetrics {
    pub(super) fn register(r: &mut Registry) -> OutboxMetrics {
        OutboxMetrics {
            relayed: register(
                r,
                "herald_outbox_relayed",
                "Outbox rows ingested and deleted, by source",
                Family::default(),
            ),
            parked: register(r, "herald_outbox_parked", "Outbox rows parked as invalid, by source", Family::default()),
            duplicates: register(
                r,
                "herald_outbox_duplicates",
                "Outbox rows whose event was already stored (a no-op re-ingest)",
                Family::default(),
            ),
            lag: register(
                r,
                "herald_outbox_lag_seconds",
                "Age of the oldest unrelayed outbox row (producer clock)",
                Family::default(),
            ),
            pending: register(r, "herald_outbox_pending_rows", "Outbox rows waiting to be relayed", Family::default()),
            parked_rows: register(r, "herald_outbox_parked_rows", "Outbox rows parked in the table", Family::default()),
        }
    }

    /// The series of the source named `name`.
    pub fn source(&self, name: &str) -> SourceMetrics {
        let l = SourceLabels { source: name.to_string() };
        SourceMetrics {
            relayed: self.relayed.get_or_create_owned(&l),
            parked: self.parked.get_or_create_owned(&l),
            duplicates: self.duplicates.get_or_create_owned(&l),
            lag_seconds: self.lag.get_or_create_owned(&l),
            pending_rows: self.pending.get_or_create_owned(&l),
            parked_rows: self.parked_rows.get_or_create_owned(&l),
        }
    }
}
