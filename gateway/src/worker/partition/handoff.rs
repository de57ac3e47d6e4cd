//! Claim at intake, the partition's side: while it knows nothing of its endpoint is waiting
//! in the store and it holds the endpoint's lease, it is open, and intake commits lease new
//! deliveries straight to it (`store::Handoff`); they reach its queue through the signal's
//! inbox with no claim of their own.

use std::sync::atomic::Ordering;

use super::signal::Open;
use super::{Partition, claim_request};

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
        self.signal.set_open(self.open_terms());
    }

    fn open_terms(&self) -> Option<Open> {
        let (Some(_), Some(target), Some(held), Some(shared)) = (self.drained, &self.target, self.held, &self.shared)
        else {
            return None;
        };
        if self.stale || shared.halted.load(Ordering::Acquire) {
            return None;
        }
        let now = self.inner.clock.now();
        let waiting = (self.queue.len() + self.signal.inbox_len()) as u32;
        let req = claim_request(&self.inner, &self.id, &target.endpoint.spec, waiting, now);
        let room = req.limit.checked_sub(waiting).filter(|r| *r > 0)?;
        Some(Open { held_until: self.inner.clock.millis_at(held), lease_ms: req.lease_until - now, room })
    }
}
