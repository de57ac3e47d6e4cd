//! The transactional outbox relay: one task per `[[outbox]]` source moves committed rows
//! from a producer's Postgres table into Herald through `intake::commit`, the same durable,
//! idempotent intake the events API uses (same validation, fan-out and `(tenant, id)`
//! idempotency), and only then deletes them from the producer's table, in the producer
//! transaction that locked them. A row intake refuses is parked in the table with its
//! reason and never blocks the rows behind it.
//!
//! At-least-once: a crash between Herald's commit and the producer's re-reads at most one
//! batch, and re-ingesting it is a no-op. When Herald's store fails, the producer
//! transaction rolls back (rows stay) and the relay backs off. This module speaks no SQL:
//! the producer's side is `store::outbox`.
//!
//! A source's task takes committed rows under `FOR UPDATE SKIP LOCKED` (in `seq` order),
//! validates each with intake's own `prepare`, and wakes on the table's `NOTIFY` or every
//! `poll_interval`; it backs off while either database fails, and measures the backlog (lag
//! on the producer's clock) for `/metrics` and `/readyz`.

mod relay;

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::config::OutboxSource;
use crate::metrics::Metrics;
use crate::ops::Ops;
use crate::store::{Committer, DynStore, StoreError};

/// What a source's relay is doing, for `GET /readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayState {
    /// Not yet connected or measured.
    Starting,
    /// Relaying (or idle with nothing to relay).
    Relaying,
    /// Herald's own store refused the last commit: rows wait in the outbox.
    StoreUnavailable,
    /// The producer's database could not be read or written.
    ProducerUnavailable,
}

impl RelayState {
    pub fn as_str(self) -> &'static str {
        match self {
            RelayState::Starting => "starting",
            RelayState::Relaying => "relaying",
            RelayState::StoreUnavailable => "store_unavailable",
            RelayState::ProducerUnavailable => "producer_unavailable",
        }
    }
}

/// One source's latest figures.
#[derive(Debug, Clone)]
pub struct SourceStatus {
    pub name: String,
    pub state: RelayState,
    /// Age of the oldest unrelayed row, in seconds (0 when none waits; `None`: unknown).
    pub lag_seconds: Option<f64>,
    pub pending: i64,
    pub parked: i64,
    /// The last failure, while `state` is not `Relaying`.
    pub error: Option<String>,
}

/// The running relays' status, shared with the API.
#[derive(Clone, Default)]
pub struct Relays {
    sources: Vec<Arc<Mutex<SourceStatus>>>,
}

impl Relays {
    /// Every source's latest status, in config order.
    pub fn status(&self) -> Vec<SourceStatus> {
        self.sources.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect()
    }
}

/// What every relay needs from the node.
#[derive(Clone)]
pub struct Node {
    pub store: DynStore,
    pub committer: Committer,
    pub metrics: Arc<Metrics>,
    pub engine: crate::intake::Waker,
    pub ops: Ops,
    pub limits: crate::intake::IntakeLimits,
    /// Relay spans, when exported.
    pub telemetry: crate::telemetry::Telemetry,
    /// The event catalog, checked as the events API checks it.
    pub catalog: Arc<crate::catalog::Catalog>,
}

/// Starts one relay task per source; each stops when `stop` turns true.
pub fn start(sources: &[OutboxSource], node: Node, stop: watch::Receiver<bool>) -> Result<Relays, StoreError> {
    let mut relays = Relays::default();
    for source in sources {
        let status = Arc::new(Mutex::new(SourceStatus {
            name: source.name.clone(),
            state: RelayState::Starting,
            lag_seconds: None,
            pending: 0,
            parked: 0,
            error: None,
        }));
        let relay = relay::Relay::new(source.clone(), node.clone(), status.clone())?;
        tokio::spawn(relay.run(stop.clone()));
        relays.sources.push(status);
    }
    Ok(relays)
}
