//! The partition's view of its lease: what each claim and renewal said about it, when to
//! renew, and the `partitions_held` gauge. The lease itself is written by the committer,
//! riding the claims' group commits (see `Engine::apply`'s `WriteOp::Partition`).

use std::time::Duration;

use tokio::time::Instant;

use super::super::{PARTITION_LEASE, PARTITION_RENEW_BEFORE};
use super::{LeasedClaim, Partition};
use crate::model::Millis;
use crate::store::{ClaimBatch, PartitionLease};

impl Partition {
    /// Learns from a claim made under the partition lease (submitted at `renewed` if it
    /// renewed the lease) whether the lease holds, and returns what it claimed.
    pub(super) fn note_claim(&mut self, (renewed, claim): LeasedClaim) -> Option<ClaimBatch> {
        match claim {
            Ok(Some(claimed)) => {
                if let Some(started) = renewed {
                    self.note_lease(started, true);
                }
                Some(claimed)
            }
            Ok(None) => {
                self.set_held(None);
                None
            }
            Err(e) => {
                tracing::warn!(endpoint_id = %self.id, error = %e, "claim failed");
                Some(ClaimBatch::default())
            }
        }
    }

    /// Records a commit's answer about the partition lease, submitted at `started`.
    pub(super) fn note_lease(&mut self, started: Instant, held: bool) {
        self.set_held(held.then(|| Self::held_after(started)));
    }

    /// Until when a lease taken or renewed by a commit submitted at `started` holds, as
    /// far as this node knows: counted from before the commit, so the local view never
    /// outlives the stored lease.
    pub(super) fn held_after(started: Instant) -> Instant {
        started + PARTITION_LEASE - Duration::from_millis(500)
    }

    /// The partition lease every claim takes or renews on the way.
    pub(super) fn lease_until(now: Millis) -> Millis {
        now + PARTITION_LEASE.as_millis() as i64
    }

    /// Until when a claim at `now` should take or renew the partition lease: `None` while
    /// the lease holds well beyond the renewal margin (the claim then only checks it, and
    /// writes nothing for it).
    pub(super) fn renew_with_claim(&self, now: Millis) -> Option<Millis> {
        let fresh = self.held.is_some_and(|until| until > Instant::now() + PARTITION_RENEW_BEFORE);
        (!fresh).then(|| Self::lease_until(now))
    }

    /// Keeps this node's lease on the endpoint's partition. Every claim takes or renews it
    /// in its own commit, so a partition with nothing claimed waits for no lease write: its
    /// next claim proves the lease or finds it lost. Deliveries already claimed are sent
    /// only under a lease known to hold; one close to expiry is renewed in the background,
    /// riding the next group commit while sending goes on.
    pub(super) async fn hold(&mut self) -> bool {
        self.collect_renewal(false).await;
        let now = Instant::now();
        match self.held {
            Some(until) if until > now + PARTITION_RENEW_BEFORE => return true,
            Some(until) if until > now => {
                self.renew();
                return true;
            }
            _ if self.queue.is_empty() && self.prefetch.is_none() => return true,
            _ => {}
        }
        self.renew();
        self.collect_renewal(true).await;
        self.held.is_some_and(|until| until > Instant::now())
    }

    /// Starts renewing the partition lease unless a renewal is under way.
    pub(super) fn renew(&mut self) {
        if self.renewal.is_some() {
            return;
        }
        let now = self.inner.clock.now();
        let lease = PartitionLease {
            endpoint: self.id.clone(),
            owner: self.inner.owner.clone(),
            now,
            until: Some(Self::lease_until(now)),
        };
        let committer = self.inner.committer.clone();
        self.renewal = Some(tokio::spawn(async move { (Instant::now(), committer.hold_partition(lease).await) }));
    }

    /// Takes a finished renewal's answer (with `wait`, waits for a running one).
    pub(super) async fn collect_renewal(&mut self, wait: bool) {
        let ready = self.renewal.as_ref().is_some_and(|h| wait || h.is_finished());
        let Some(h) = self.renewal.take_if(|_| ready) else { return };
        match h.await {
            Ok((started, Ok(held))) => self.note_lease(started, held),
            Ok((_, Err(e))) => tracing::warn!(endpoint_id = %self.id, error = %e, "cannot renew partition lease"),
            Err(e) => tracing::error!(endpoint_id = %self.id, error = %e, "partition lease renewal task failed"),
        }
    }

    /// Keeps the `partitions_held` gauge in step with `held`.
    pub(super) fn set_held(&mut self, held: Option<Instant>) {
        match (self.held.is_some(), held.is_some()) {
            (false, true) => drop(self.inner.metrics.partitions_held.inc()),
            (true, false) => drop(self.inner.metrics.partitions_held.dec()),
            _ => {}
        }
        self.held = held;
    }
}
