//! Operational events and housekeeping: Herald delivers its own events (`endpoint.paused`,
//! `endpoint.disabled`, `delivery.dead`, `dead_letters.stale`) as webhooks to an operator
//! endpoint from config, through the same durable, signed, retried path as any tenant's;
//! and it purges finished deliveries past their retention in small batches.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use serde_json::json;

use crate::clock::{Clock, now_ms, rfc3339};
use crate::config::{OperatorConfig, RetentionConfig};
use crate::intake::{Wake, Waker};
use crate::metrics::Metrics;
use crate::model::*;
use crate::store::{Claimed, Committer, DynStore, StoreError};

const OPS_ENDPOINT: &str = "ep_operator";

/// Emits operational events. Cheap to clone; a no-op when no operator URL is configured.
#[derive(Clone)]
pub struct Ops {
    committer: Committer,
    metrics: Arc<Metrics>,
    /// The engine, once it runs (it is started with these `Ops`, so a weak reference):
    /// events are committed through `intake::commit` like every other, on its clock.
    engine: Arc<OnceLock<Weak<dyn Wake>>>,
    enabled: bool,
    ttl_ms: Millis,
}

impl Ops {
    /// Makes sure the operator tenant and endpoint match the config.
    pub async fn setup(
        store: &DynStore,
        committer: Committer,
        metrics: Arc<Metrics>,
        config: &OperatorConfig,
        ttl: Duration,
    ) -> Result<Ops, StoreError> {
        let ops = Ops {
            committer,
            metrics,
            engine: Arc::default(),
            enabled: config.url.is_some(),
            ttl_ms: ttl.as_millis() as i64,
        };
        let Some(url) = &config.url else { return Ok(ops) };
        let tenant = TenantId::from_stored(OPS_TENANT);
        let now = now_ms();
        if store.get_tenant(&tenant).await?.is_none() {
            let t = Tenant { id: tenant.clone(), name: "Herald operational events".into(), created_at: now };
            match store.create_tenant(&t).await {
                Ok(()) | Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let spec = EndpointSpec::operator(url.clone(), config.secret.expose().to_string());
        let id = EndpointId::from_stored(OPS_ENDPOINT);
        match store.endpoint(&id).await? {
            Some(mut e) if e.spec != spec => {
                e.spec = spec;
                e.updated_at = now;
                store.update_endpoint(&e).await?;
            }
            Some(_) => {}
            None => {
                let e = Endpoint::new(id, tenant, spec, now);
                match store.insert_endpoint(&e).await {
                    Ok(()) | Err(StoreError::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(ops)
    }

    /// Tells these `Ops` the engine they wake (and whose clock they read) from now on.
    pub fn attach(&self, engine: &Waker) {
        let _ = self.engine.set(Arc::downgrade(engine));
    }

    /// The engine's time, or the wall clock's before the engine runs.
    pub fn now(&self) -> Millis {
        Attached(self.engine.clone()).get().map_or_else(now_ms, |e| e.clock().now())
    }

    /// Emits one event, idempotently by `id`; delivered by the engine like any other. Its
    /// payload (the webhook's `data`) is `fields` with the `tenant` and the time (`at`).
    pub fn emit(&self, tenant: &TenantId, event_type: &str, id: String, fields: serde_json::Value) {
        if !self.enabled || tenant.as_str() == OPS_TENANT {
            return;
        }
        let now = self.now();
        let payload = payload(tenant, now, fields).to_string();
        let event = match EventId::parse(&id) {
            Ok(id) => NewEvent {
                tenant: TenantId::from_stored(OPS_TENANT),
                id,
                event_type: event_type.into(),
                fingerprint: event_fingerprint(event_type, &payload),
                payload,
                created_at: now,
                expires_at: now + self.ttl_ms,
                ordering_key: None,
                trace: None,
                schema_version: None,
                only: None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "bad operational event id");
                return;
            }
        };
        let (committer, metrics, engine) = (self.committer.clone(), self.metrics.clone(), self.engine.clone());
        tokio::spawn(async move {
            if let Err(e) = crate::intake::commit(&committer, &metrics, &Attached(engine), vec![event]).await {
                tracing::error!(error = %e, "cannot record operational event");
            }
        });
    }
}

/// An operational event's payload: `fields` flat beside `tenant` and `at` (the webhook
/// envelope already puts the payload under `data`; a second `data` inside it was noise).
fn payload(tenant: &TenantId, now: Millis, fields: serde_json::Value) -> serde_json::Value {
    let mut payload = match fields {
        serde_json::Value::Object(fields) => fields,
        other => serde_json::Map::from_iter([("value".to_string(), other)]),
    };
    payload.insert("tenant".into(), json!(tenant));
    payload.insert("at".into(), json!(rfc3339(now)));
    serde_json::Value::Object(payload)
}

/// The engine once attached; before that (or after it is gone), nothing to wake: its
/// first scan finds the work.
struct Attached(Arc<OnceLock<Weak<dyn Wake>>>);

impl Attached {
    fn get(&self) -> Option<Waker> {
        self.0.get().and_then(Weak::upgrade)
    }
}

impl Wake for Attached {
    fn poke_after(&self, endpoints: &[EndpointId], seq: u64) {
        if let Some(engine) = self.get() {
            engine.poke_after(endpoints, seq);
        }
    }
    fn hand_over(&self, leased: &mut dyn Iterator<Item = (EndpointId, Claimed)>) {
        if let Some(engine) = self.get() {
            engine.hand_over(leased);
        }
    }
    fn changed(&self, endpoints: &[EndpointId]) {
        if let Some(engine) = self.get() {
            engine.changed(endpoints);
        }
    }
    fn clock(&self) -> Clock {
        self.get().map_or_else(Clock::new, |e| e.clock())
    }
}

/// Runs the periodic housekeeping: stale dead-letter alerts and retention.
pub fn start_housekeeping(
    store: DynStore,
    ops: Ops,
    operator: OperatorConfig,
    retention: RetentionConfig,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let ops = Arc::new(ops);
    tokio::spawn(async move {
        let mut stop = stop;
        loop {
            let now = ops.now();
            if ops.enabled {
                match store.stale_dead_letters(now - operator.stale_after.as_millis() as i64).await {
                    Ok(stale) => {
                        for (tenant, oldest, count) in stale {
                            let id = format!("dead_letters.stale.{tenant}.{oldest}");
                            let data = json!({ "oldest_dead_at": rfc3339(oldest), "dead_letters": count });
                            ops.emit(&tenant, "dead_letters.stale", id, data);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "stale dead-letter check failed"),
                }
            }
            let delivered_before = now - retention.delivered.as_millis() as i64;
            let dead_before = now - retention.dead.as_millis() as i64;
            loop {
                match store.purge(delivered_before, dead_before, retention.batch).await {
                    Ok(n) if n == u64::from(retention.batch) => tokio::task::yield_now().await,
                    Ok(n) => {
                        if n > 0 {
                            tracing::info!(purged = n, "retention purge");
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "retention purge failed");
                        break;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(retention.every.min(operator.check_every)) => {}
                _ = stop.changed() => return,
            }
        }
    });
}
