//! One source's relay loop: take a batch under lock, validate each row, commit the valid
//! ones through intake, delete them and park the refused ones in the same producer
//! transaction; wake on NOTIFY or every `poll_interval`; back off while a database fails.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{Notify, watch};

use super::{Node, RelayState, SourceStatus};
use crate::config::OutboxSource;
use crate::intake::{self, IntakeError};
use crate::metrics::SourceMetrics;
use crate::model::OPS_TENANT;
use crate::model::{NewEvent, TenantId, TraceContext};
use crate::store::StoreError;
use crate::store::outbox::{OutboxRow, ProducerOutbox};
use crate::telemetry::Span;

/// The first wait after a failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The backlog (lag, pending and parked rows) is measured at most this often.
const MEASURE_EVERY: Duration = Duration::from_secs(1);

/// Why a step failed: whose database, so the status says where to look.
enum StepError {
    Store(StoreError),
    Producer(StoreError),
}

pub(super) struct Relay {
    source: OutboxSource,
    node: Node,
    outbox: ProducerOutbox,
    status: Arc<Mutex<SourceStatus>>,
    metrics: SourceMetrics,
    /// Tenants seen to exist (tenants are never deleted, so a hit stays true).
    tenants: HashSet<TenantId>,
}

impl Relay {
    pub(super) fn new(source: OutboxSource, node: Node, status: Arc<Mutex<SourceStatus>>) -> Result<Relay, StoreError> {
        let outbox = ProducerOutbox::connect(&source.url, &source.table, source.max_connections)?;
        let metrics = node.metrics.outbox.source(&source.name);
        Ok(Relay { source, node, outbox, status, metrics, tenants: HashSet::new() })
    }

    /// Relays until `stop` turns true. A batch in progress finishes first; one cut off by
    /// the process ending rolls back in the producer's database and is re-read later.
    pub(super) async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let wake = Arc::new(Notify::new());
        self.outbox.watch(wake.clone(), self.source.poll_interval.max(FIRST_BACKOFF));
        let mut backoff = FIRST_BACKOFF;
        let mut measured: Option<tokio::time::Instant> = None;
        while !*stop.borrow() {
            let wait = match self.step().await {
                Ok(taken) => {
                    backoff = FIRST_BACKOFF;
                    self.set_state(RelayState::Relaying, None);
                    // A full batch: more may be waiting.
                    (taken < self.source.batch as usize).then_some(self.source.poll_interval)
                }
                Err(e) => {
                    self.failed(e);
                    let wait = backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    Some(wait)
                }
            };
            if measured.is_none_or(|at| at.elapsed() >= MEASURE_EVERY) {
                self.measure().await;
                measured = Some(tokio::time::Instant::now());
            }
            if let Some(wait) = wait {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }

    /// One batch: returns how many rows it took.
    async fn step(&mut self) -> Result<usize, StepError> {
        let batch = self.outbox.take(self.source.batch).await.map_err(StepError::Producer)?;
        let taken = batch.rows.len();
        if taken == 0 {
            return Ok(0);
        }
        let mut parked: Vec<(&OutboxRow, String)> = Vec::new();
        let mut valid: Vec<(&OutboxRow, NewEvent)> = Vec::with_capacity(taken);
        for row in &batch.rows {
            match self.prepare(row).await.map_err(StepError::Store)? {
                Ok(event) => valid.push((row, event)),
                Err(reason) => parked.push((row, reason)),
            }
        }
        let spans = self.relay_spans(&mut valid);
        let duplicates = self.ingest(&mut valid, &mut parked).await.map_err(StepError::Store)?;
        let relayed: Vec<i64> = valid.iter().map(|(row, _)| row.seq).collect();
        let parked_rows: Vec<(i64, String)> = parked.iter().map(|(row, reason)| (row.seq, reason.clone())).collect();
        // Only parked rows are kept for the report after the commit (they are rare).
        let parked: Vec<(OutboxRow, String)> = parked.into_iter().map(|(row, r)| (row.clone(), r)).collect();
        let deleted = batch.finish(&relayed, &parked_rows).await.map_err(StepError::Producer)?;
        self.metrics.relayed.inc_by(deleted);
        self.metrics.duplicates.inc_by(duplicates);
        self.metrics.parked.inc_by(parked.len() as u64);
        for (row, reason) in &parked {
            self.report_parked(row, reason);
        }
        tracing::debug!(source = %self.source.name, taken, relayed = deleted, duplicates, "outbox batch");
        drop(spans);
        Ok(taken)
    }

    /// When spans are exported: one per event relayed, a child of its row's trace context
    /// (or the root of a new trace), which becomes the event's context (as the API's
    /// intake span does). Ended once the batch is settled in both databases.
    fn relay_spans(&self, valid: &mut [(&OutboxRow, NewEvent)]) -> Vec<Span> {
        if !self.node.telemetry.is_on() {
            return Vec::new();
        }
        let relay = |event: &mut NewEvent| {
            let mut span = self.node.telemetry.intake("herald.outbox.relay", event.trace.as_ref())?;
            span.set("herald.outbox.source", self.source.name.clone());
            span.set("herald.tenant", event.tenant.to_string());
            span.set("herald.event_id", event.id.to_string());
            event.trace = Some(span.context());
            Some(span)
        };
        valid.iter_mut().filter_map(|(_, event)| relay(event)).collect()
    }

    /// Commits the valid events through intake. An event whose id the tenant already used
    /// with another type or payload refuses the whole commit: it is parked, and the rest
    /// committed again. Returns how many were duplicates (already stored).
    async fn ingest<'r>(
        &self,
        valid: &mut Vec<(&'r OutboxRow, NewEvent)>,
        parked: &mut Vec<(&'r OutboxRow, String)>,
    ) -> Result<u64, StoreError> {
        let n = &self.node;
        while !valid.is_empty() {
            let events = valid.iter().map(|(_, e)| e.clone()).collect();
            match intake::commit(&n.committer, &n.metrics, &*n.engine, events).await {
                Ok(outcomes) => return Ok(outcomes.iter().filter(|(_, o)| o.duplicate).count() as u64),
                Err(e @ IntakeError::Conflict { at, .. }) => {
                    let (row, _) = valid.remove(at);
                    parked.push((row, reason(&e)));
                }
                Err(IntakeError::Store(e)) => return Err(e),
                Err(other) => return Err(StoreError::backend(format!("intake refused a validated batch: {other}"))),
            }
        }
        Ok(0)
    }

    /// Validates one row into an event, or the reason it is parked. `Err`: Herald's store
    /// could not say whether its tenant exists.
    async fn prepare(&mut self, row: &OutboxRow) -> Result<Result<NewEvent, String>, StoreError> {
        let tenant = match self.tenant_of(row) {
            Ok(t) => t,
            Err(reason) => return Ok(Err(reason)),
        };
        if !self.tenants.contains(&tenant) {
            if self.node.store.get_tenant(&tenant).await?.is_none() {
                return Ok(Err(format!("unknown_tenant: no tenant {:?} in Herald", tenant.as_str())));
            }
            self.tenants.insert(tenant.clone());
        }
        let now = self.node.engine.clock().now();
        let fields = (row.event_id.as_str(), row.event_type.as_str(), row.payload.as_str());
        let mut event = match intake::prepare_fields(&tenant, fields, self.checks(), now, &mut rand::rng()) {
            Ok(event) => event,
            Err(e) => return Ok(Err(reason(&e))),
        };
        // A malformed trace context is none, as on the API: it never parks a row.
        event.trace = row.traceparent.as_deref().and_then(|t| TraceContext::parse(t, row.tracestate.as_deref()));
        Ok(Ok(event))
    }

    /// What intake checks a row against, as it checks a posted event.
    fn checks(&self) -> intake::Checks<'_> {
        intake::Checks { limits: &self.node.limits, catalog: &self.node.catalog }
    }

    /// The Herald tenant of a row: its `tenant` through the source's map, or the source's
    /// default tenant when NULL.
    fn tenant_of(&self, row: &OutboxRow) -> Result<TenantId, String> {
        let Some(raw) = row.tenant.as_deref() else {
            return self
                .source
                .tenant
                .clone()
                .ok_or_else(|| "unknown_tenant: tenant is NULL and the source has no default tenant".to_string());
        };
        if let Some(mapped) = self.source.tenant_map.get(raw) {
            return Ok(mapped.clone());
        }
        let id = TenantId::parse(raw).map_err(|e| format!("unknown_tenant: {}", e.0))?;
        if id.as_str() == OPS_TENANT {
            return Err(format!("unknown_tenant: {OPS_TENANT:?} is Herald's own tenant"));
        }
        Ok(id)
    }

    /// Logs a parked row and emits `outbox.row_parked` to the operator.
    fn report_parked(&self, row: &OutboxRow, reason: &str) {
        let source = &self.source.name;
        tracing::warn!(source = %source, seq = row.seq, event_id = %row.event_id, reason, "outbox row parked");
        let data = json!({"source": source, "seq": row.seq, "event_id": row.event_id,
            "event_type": row.event_type, "reason": reason});
        let tenant = TenantId::from_stored(row.tenant.clone().unwrap_or_default());
        self.node.ops.emit(&tenant, "outbox.row_parked", format!("outbox_{source}_{}", row.seq), data);
    }

    /// Reads the backlog into the metrics and the status; a failure only logs.
    async fn measure(&self) {
        match self.outbox.backlog().await {
            Ok(b) => {
                let lag = b.oldest_secs.unwrap_or(0.0).max(0.0);
                self.metrics.lag_seconds.set(lag);
                self.metrics.pending_rows.set(b.pending);
                self.metrics.parked_rows.set(b.parked);
                let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
                (s.lag_seconds, s.pending, s.parked) = (Some(lag), b.pending, b.parked);
            }
            Err(e) => tracing::debug!(source = %self.source.name, error = %e, "cannot measure the outbox backlog"),
        }
    }

    fn failed(&self, e: StepError) {
        let (state, e) = match e {
            StepError::Store(e) => (RelayState::StoreUnavailable, e),
            StepError::Producer(e) => (RelayState::ProducerUnavailable, e),
        };
        tracing::warn!(source = %self.source.name, state = state.as_str(), error = %e, "outbox relay waits; rows stay in the outbox");
        self.set_state(state, Some(e.to_string()));
    }

    fn set_state(&self, state: RelayState, error: Option<String>) {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        (s.state, s.error) = (state, error);
    }
}

/// The reason stored with a parked row: a short code, then intake's message.
fn reason(e: &IntakeError) -> String {
    let code = match e {
        IntakeError::Invalid(_) => "invalid",
        IntakeError::Schema(_) => "schema",
        IntakeError::TooLarge { .. } => "too_large",
        IntakeError::TooDeep { .. } => "too_deep",
        IntakeError::Conflict { .. } => "conflict",
        IntakeError::Store(_) => "store",
    };
    format!("{code}: {e}")
}
