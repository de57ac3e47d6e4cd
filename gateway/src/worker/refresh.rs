//! The node's check of its endpoints' versions: every [`CHECK_EVERY`], one read of the
//! stored versions of all the endpoints its running partitions pace (`Reads::endpoint_versions`),
//! and a change told to each partition whose endpoint's version moved since it read it, so
//! that a change nobody announced (a lost notice, an edit made in the database) applies
//! within a second on every node. Only the changed endpoints are read again, each by its
//! partition. It never reads an endpoint itself and never wakes an unchanged partition.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::Inner;
use super::signal::Signal;
use crate::model::EndpointId;

/// How often the node compares the versions: twice a second, so a change is seen within
/// half a second and applies within one.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Checks the versions every [`CHECK_EVERY`] until shutdown.
pub(super) async fn run(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.clone();
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*shutdown.borrow() {
        tokio::select! {
            _ = tick.tick() => check(&inner).await,
            _ = shutdown.changed() => {}
        }
    }
}

/// One check: the partitions that have read their endpoint, their endpoints' stored
/// versions in one statement, and a change told to each that read another version (or
/// whose endpoint is gone). No statement when no partition has read its endpoint.
async fn check(inner: &Inner) {
    let read: Vec<(EndpointId, Arc<Signal>)> = {
        let parts = inner.partitions.lock().expect("partition map");
        parts.iter().filter(|(_, s)| s.read_version().is_some()).map(|(id, s)| (id.clone(), s.clone())).collect()
    };
    if read.is_empty() {
        return;
    }
    let ids: Vec<EndpointId> = read.iter().map(|(id, _)| id.clone()).collect();
    let stored: HashMap<EndpointId, i64> = match inner.store.endpoint_versions(&ids).await {
        Ok(versions) => versions.into_iter().collect(),
        Err(e) => return tracing::warn!(error = %e, "cannot check the endpoints' versions"),
    };
    for (id, signal) in read {
        if signal.stored_at(stored.get(&id).copied()) {
            tracing::debug!(endpoint_id = %id, "endpoint changed in the store; its partition reads it again");
        }
    }
}
