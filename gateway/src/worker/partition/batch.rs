//! A batching endpoint's side of the partition: whether the queue makes a batch yet (full
//! by events or bytes, or its oldest delivery due `max_wait` ago), waiting for company
//! until then (claiming what the store may hold, taking what intake hands over), and
//! taking one batch off the queue. One batch is one request: it takes one pacer permit and
//! one in-flight slot. An ordered endpoint's claims hold only the heads of their keys, so a
//! batch never holds two deliveries of one key, and a key's next goes in a later batch.

use tokio::time::Instant;

use super::super::SCAN_EVERY;
use super::super::attempt::NonEmpty;
use super::super::known::Known;
use super::{Flow, Partition};
use crate::model::{Batching, Millis};
use crate::store::Claimed;

impl Partition {
    /// Until when the queue waits for company: `None` when it makes a batch now (full, or
    /// its oldest delivery due `max_wait` ago).
    pub(super) fn batch_wait(&mut self, b: &Batching) -> Option<Millis> {
        let now = self.inner.clock.now();
        let since =
            *self.batch_since.get_or_insert_with(|| self.queue.iter().map(|d| due(d, now)).min().unwrap_or(now));
        let (mut events, mut bytes) = (0, 0u64);
        for d in &self.queue {
            events += 1;
            bytes += d.payload.len() as u64;
            if b.full(events, bytes) {
                return None;
            }
        }
        let until = since.saturating_add(b.max_wait_ms as i64);
        (until > now).then_some(until)
    }

    /// Waits for company until `until` (a second at most, so the loop keeps the lease):
    /// claims what the store may hold first, then wakes on new work, a change or shutdown.
    pub(super) async fn wait_for_company(&mut self, until: Millis) -> Flow {
        if self.prefetch.is_none() {
            self.prefetch_claim(true);
        }
        if self.prefetch.is_some() {
            self.collect_prefetch(true).await;
            return Flow::Again;
        }
        self.publish_open();
        let wake = self.inner.clock.instant_at(until).min(Instant::now() + SCAN_EVERY);
        let mut shutdown = self.inner.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = self.signal.work.notified() => {
                self.signal.known(Known::take_fresh);
            }
            _ = self.signal.change.notified() => {}
            _ = shutdown.changed() => {}
        }
        Flow::Again
    }

    /// The next request's deliveries: one, or a batch of up to `max_events` and
    /// `max_bytes` of payload (one larger delivery goes alone). `None`: the queue is empty.
    pub(super) fn take(&mut self, batch: Option<&Batching>) -> Option<NonEmpty<Claimed>> {
        let mut taken = NonEmpty::one(self.queue.pop_front()?);
        if let Some(b) = batch {
            let mut bytes = taken.first().payload.len() as u64;
            while let Some(d) = self.queue.front()
                && !b.full(taken.len(), bytes)
                && bytes + d.payload.len() as u64 <= b.max_bytes
            {
                bytes += d.payload.len() as u64;
                taken.push(self.queue.pop_front().expect("a front"));
            }
        }
        // What is left waits from its own oldest due time.
        self.batch_since = None;
        Some(taken)
    }
}

/// When a queued delivery fell due, as the partition can tell: a first attempt when its
/// event was taken, a retry or a replay when it was claimed (now, at the latest).
fn due(d: &Claimed, now: Millis) -> Millis {
    if d.attempts == 0 { d.event_created_at.min(now) } else { now }
}
