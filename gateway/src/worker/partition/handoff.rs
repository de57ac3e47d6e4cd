//! Claim at intake, the partition's side: while it knows nothing of its endpoint is waiting
//! in the store and it holds the endpoint's lease, it is open, and intake commits lease new
//! deliveries straight to it (`store::Handoff`); they reach its queue through the signal's
//! inbox with no claim of their own.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::super::signal::Open;
use super::{Partition, claim_request};
use crate::model::EndpointSpec;

impl Partition {
    /// Moves deliveries leased at intake into the queue, once the partition can send them
    /// (its endpoint read and its pacer set up; until then its refill takes them).
    pub(super) fn collect_handed(&mut self) {
        if self.target.is_some() && self.shared.is_some() {
            self.queue.extend(self.signal.take_inbox());
        }
    }

    /// Opens the partition to deliveries leased at intake, or closes it. Open only while
    /// nothing of the endpoint is known to wait in the store (so nothing new overtakes
    /// it), the lease holds, the endpoint is sendable as last read, and its queue is short of
    /// a claim's size; each lease is as long as a claim of that size would get.
    pub(super) fn publish_open(&self) {
        let terms = self.open_terms();
        if self.shared.as_ref().is_some_and(|sh| sh.halted.load(Ordering::Acquire)) {
            self.signal.forget_terms();
        } else if terms.is_none() && self.drained.is_none() && self.prefetch.is_some() && self.signal.expecting() {
            // A prefetch that may open the partition as it is applied is left to do so.
            return;
        }
        self.signal.set_open(terms);
    }

    fn open_terms(&self) -> Option<Open> {
        let (Some(_), Some(target), Some(held)) = (self.drained, &self.target, self.held) else { return None };
        let waiting = (self.queue.len() + self.signal.inbox_len()) as u32;
        self.terms(&target.endpoint.spec, held, waiting, 0)
    }

    /// The terms to open on once the claim about to be submitted (renewing the lease if
    /// `renewed` says when) finds nothing else due: the store opens the partition as it
    /// applies that claim (see [`Signal::claimed`](super::Signal::claimed)), not when the
    /// partition hears back, so intake commits in between hand their deliveries over
    /// instead of queueing them for another claim. Leases long enough for a full claim more.
    pub(super) fn expect_drained(&self, spec: &EndpointSpec, renewed: Option<Instant>) {
        let waiting = (self.queue.len() + self.signal.inbox_len()) as u32;
        let limit = crate::lease::claim_size(spec.rate_per_sec, spec.burst, spec.max_in_flight);
        let held = renewed.map(Self::held_after).or(self.held);
        self.signal.expect(held.and_then(|held| self.terms(spec, held, waiting, limit)));
    }

    /// Open terms for `waiting` deliveries queued, each lease long enough to send `ahead`
    /// more besides; `None` while the endpoint changed unread or was halted, or when
    /// there is no room.
    fn terms(&self, spec: &EndpointSpec, held: Instant, waiting: u32, ahead: u32) -> Option<Open> {
        if self.stale || self.shared.as_ref().is_none_or(|sh| sh.halted.load(Ordering::Acquire)) {
            return None;
        }
        let now = self.inner.clock.now();
        let req = claim_request(&self.inner, &self.id, spec, waiting + ahead, now);
        let room = req.limit.checked_sub(waiting).filter(|r| *r > 0)?;
        Some(Open { held_until: self.inner.clock.millis_at(held), lease_ms: req.lease_until - now, room })
    }
}
