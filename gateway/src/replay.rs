//! Replays: re-queue selected dead letters at a bounded rate, durably (the cursor and the
//! schedule live in the store, so a replay resumes after a restart at its pace) and on the
//! same delivery rows the engine retries, so a delivery is never in flight twice. A turn
//! re-queues only about a tenth of a second of the replay's rate, and never more than a
//! batch that has not been sent yet, so the rate is the pace deliveries go out at, and a
//! cancel finds little re-queued ahead: it puts what was not sent back among the dead
//! letters and tells the partitions holding any of it to hand it back unsent.
//!
//! Every node runs every running replay. They take turns on the stored schedule
//! ([`Admin::replay_turn`](crate::store::Admin::replay_turn)): the node whose turn it is
//! re-queues and moves the schedule on by that turn's span at the replay's rate; the
//! others find it not due yet and sleep until it is. So a cluster keeps a replay's rate,
//! and when the node that took the last turns dies, another takes the next. Once
//! everything is re-queued, the turns look whether it has all settled, and mark it done.
//!
//! A cluster's nodes find new replays every 2 s. How much a turn re-queues is
//! `Replay::plan` (pure); the figures (`sent`, `delivered`, `failed`, `returned`,
//! `pending`) are read from the deliveries it re-queued. A re-queued dead letter keeps its
//! reason and time (`prior_reason`, `prior_dead_at`): a cancel puts what is unsent back as it
//! was, in its transaction for what waits in the store, and through the release or the lease
//! recovery for what a partition holds (`sql::return_unsent`); the partitions holding some
//! are told through the endpoint-change signal (`Engine::changed`, NOTIFY on a cluster).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::intake::Waker;
use crate::model::{Millis, TenantId};
use crate::store::{DynStore, ReplayTurn, StoreError};

/// How often a node of a cluster looks for replays another node started.
const DISCOVER_EVERY: Duration = Duration::from_secs(2);

/// Runs replays. Cheap to clone.
#[derive(Clone)]
pub struct Replayer {
    store: DynStore,
    engine: Waker,
    ttl: Duration,
    /// The replays this node runs a task for.
    running: Arc<Mutex<HashSet<String>>>,
}

impl Replayer {
    /// Starts the replayer and resumes every running replay. `shared` (a store several
    /// nodes use): it also takes up, until `stopped`, the replays other nodes start.
    pub async fn start(
        store: DynStore,
        engine: Waker,
        ttl: Duration,
        shared: bool,
        mut stopped: watch::Receiver<bool>,
    ) -> Replayer {
        let r = Replayer { store, engine, ttl, running: Arc::default() };
        r.resume().await;
        if shared {
            let me = r.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stopped.changed() => return,
                        () = tokio::time::sleep(DISCOVER_EVERY) => me.resume().await,
                    }
                }
            });
        }
        r
    }

    /// Runs every running replay this node does not run yet.
    async fn resume(&self) {
        match self.store.running_replays().await {
            Ok(running) => {
                for replay in running {
                    if self.launch(replay.id.clone()) {
                        tracing::info!(replay = %replay.id, requeued = replay.requeued, selected = replay.selected, "running replay");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot read the running replays"),
        }
    }

    /// Runs a stored replay to its end (or until it is cancelled), unless this node runs
    /// it already; true if it did not.
    pub fn launch(&self, id: String) -> bool {
        if !self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone()) {
            return false;
        }
        let me = self.clone();
        tokio::spawn(async move {
            me.run(&id).await;
            me.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        });
        true
    }

    /// Cancels a running replay of `tenant`: what it has not sent goes back among the dead
    /// letters, and the partitions (of any node) that hold some of it claimed are told to
    /// hand it back unsent. False when it was not running.
    pub async fn cancel(&self, tenant: &TenantId, id: &str, now: Millis) -> Result<bool, StoreError> {
        let Some(claimed) = self.store.cancel_replay(tenant, id, now).await? else { return Ok(false) };
        if !claimed.is_empty() {
            self.engine.changed(&claimed);
        }
        tracing::info!(replay = %id, tenant = %tenant, "replay cancelled");
        Ok(true)
    }

    async fn run(&self, id: &str) {
        let ttl_ms = self.ttl.as_millis() as i64;
        loop {
            let clock = self.engine.clock();
            match self.store.replay_turn(id, clock.now(), ttl_ms).await {
                Ok(ReplayTurn::Requeued { endpoints, requeued, next_due }) => {
                    // The engine picks each re-queued delivery up when it comes due.
                    self.engine.poke(&endpoints);
                    tracing::debug!(replay = %id, requeued, "replay turn");
                    tokio::time::sleep_until(clock.instant_at(next_due)).await;
                }
                Ok(ReplayTurn::NotYet(at)) => tokio::time::sleep_until(clock.instant_at(at)).await,
                Ok(ReplayTurn::Ended) | Err(StoreError::NotFound(_)) => return,
                Err(e) => {
                    tracing::warn!(replay = %id, error = %e, "replay batch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}
