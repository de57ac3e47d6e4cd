//! Replays: re-queue selected dead letters in batches at a bounded rate, durably (the cursor
//! lives in the store, so a replay resumes after a restart) and on the same delivery rows
//! the engine retries, so a delivery is never in flight twice.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_ms;
use crate::store::DynStore;
use crate::worker::Engine;

/// Runs replays. Cheap to clone.
#[derive(Clone)]
pub struct Replayer {
    store: DynStore,
    engine: Engine,
    ttl: Duration,
}

impl Replayer {
    /// Starts the replayer and resumes every replay that was running.
    pub async fn start(store: DynStore, engine: Engine, ttl: Duration) -> Replayer {
        let r = Replayer { store, engine, ttl };
        match r.store.running_replays().await {
            Ok(running) => {
                for replay in running {
                    tracing::info!(replay = %replay.id, sent = replay.sent, selected = replay.selected, "resuming replay");
                    r.launch(replay.id, replay.rate_per_sec, replay.batch);
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot resume replays"),
        }
        r
    }

    /// Runs a stored replay to its end (or until it is cancelled).
    pub fn launch(&self, id: String, rate_per_sec: f64, batch: u32) {
        let me = Arc::new(self.clone());
        tokio::spawn(async move { me.run(id, rate_per_sec, batch).await });
    }

    async fn run(&self, id: String, rate_per_sec: f64, batch: u32) {
        let spacing_ms = 1000.0 / rate_per_sec;
        let pause = Duration::from_secs_f64(f64::from(batch) / rate_per_sec);
        loop {
            let now = now_ms();
            let deadline = now + self.ttl.as_millis() as i64;
            match self.store.replay_batch(&id, now, spacing_ms, deadline).await {
                Ok((endpoints, n)) => {
                    // The engine picks each re-queued delivery up when it comes due.
                    self.engine.poke(&endpoints);
                    tracing::debug!(replay = %id, requeued = n, "replay batch");
                    if n < batch {
                        return;
                    }
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    tracing::warn!(replay = %id, error = %e, "replay batch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}
