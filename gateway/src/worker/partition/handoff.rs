//! Claim at intake, the partition's side: while it knows nothing of its endpoint is waiting
//! in the store and it holds the endpoint's lease, it is open, and intake commits lease new
//! deliveries straight to it (`store::Handoff`); they reach its queue through the signal's
//! inbox with no claim of their own. The rules are [`Known`]'s; this file gives them the
//! partition's facts (lease, queue, halt, the claim's size and lease length).

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::super::known::Known;
use super::{Partition, claim_limit, claim_request};
use crate::model::{EndpointSpec, Millis};

impl Partition {
    /// Moves deliveries leased at intake into the queue, once the partition can send them
    /// (its endpoint read and its pacer set up; until then its refill takes them).
    pub(super) fn collect_handed(&mut self) {
        if self.target.is_some() && self.shared.is_some() {
            self.queue.extend(self.signal.known(Known::take_inbox));
        }
    }

    /// Opens the partition to deliveries leased at intake, or closes it. Open only while
    /// nothing of the endpoint is known to wait in the store (so nothing new overtakes
    /// it), the lease holds, the endpoint is sendable as last read, and its queue is short of
    /// a claim's size; each lease is as long as a claim of that size would get.
    pub(super) fn publish_open(&self) {
        let (halted, claiming, queued) = (self.halted(), self.prefetch.is_some(), self.queue.len() as u32);
        let held = self.held.map(|h| self.inner.clock.millis_at(h));
        self.signal.known(|k| {
            let target = self.target.as_ref().filter(|t| !self.unplugged(&t.endpoint));
            let terms = match (target, held) {
                (Some(target), Some(held)) => {
                    k.open_terms(held, queued, halted, |n| self.claim_terms(&target.endpoint.spec, n))
                }
                _ => None,
            };
            k.publish(terms, halted, claiming);
        });
    }

    /// The terms to open on once the claim about to be submitted (renewing the lease if
    /// `renewed` says when) finds nothing else due: the store opens the partition as it
    /// applies that claim (see [`Known::claimed`]), not when the partition hears back, so
    /// intake commits in between hand their deliveries over instead of queueing them for
    /// another claim. Leases long enough for a full claim more.
    pub(super) fn expect_drained(&self, spec: &EndpointSpec, renewed: Option<Instant>) {
        let (halted, queued) = (self.halted(), self.queue.len() as u32);
        let limit = claim_limit(spec);
        let held = renewed.map(Self::held_after).or(self.held).map(|h| self.inner.clock.millis_at(h));
        self.signal.known(|k| {
            let terms = held.and_then(|held| k.terms(held, queued, limit, halted, |n| self.claim_terms(spec, n)));
            k.expect(terms);
        });
    }

    /// A claim's size and lease length (from now) with `queued` deliveries queued.
    fn claim_terms(&self, spec: &EndpointSpec, queued: u32) -> (u32, Millis) {
        let now = self.inner.clock.now();
        let req = claim_request(&self.inner, &self.id, spec, queued, now);
        (req.limit, req.lease_until - now)
    }

    /// Was the endpoint held for a human or disabled by an attempt (or is nothing set up)?
    fn halted(&self) -> bool {
        self.shared.as_ref().is_none_or(|sh| sh.halted.load(Ordering::Acquire))
    }
}
