//! What a partition knows of its endpoint's work in the store, and whether intake may lease
//! new deliveries straight to it (claim at intake), as one state machine. Pure: the store's
//! op numbers and `now` are arguments. It uses no tokio, no atomics and no locks, and wakes
//! no one: [`Signal`](super::signal::Signal) holds it in one mutex, shared by the partition
//! task, the engine's wakes and the store's writer thread (`store::Handoff`), and does the
//! waking.
//!
//! The orderings it keeps, each found under load (`git log -- gateway/src/worker`):
//! - a claim that took all that was due opens the partition as the store applies it, so an
//!   intake op later in the same group commit hands its deliveries over ([`Known::claimed`]);
//! - a wake for an intake op numbered before that claim is not news; one after it is
//!   ([`Known::work_after`]);
//! - a change closes the partition to intake at once, drops the terms a claim under way
//!   would open on, and keeps it closed until the endpoint is read again ([`Known::changed`]);
//! - handing back closes it first, and it retires only with nothing in its inbox;
//! - a lease is given only while the partition lease holds and room is left
//!   ([`Known::lease`]).

use crate::model::Millis;
use crate::store::Claimed;

/// The terms on which a partition takes new deliveries at intake (claim at intake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::worker) struct Open {
    /// Its partition lease is known to hold until then (stored time): none is given after.
    pub(in crate::worker) held_until: Millis,
    /// How long each delivery's lease is: long enough to send every one it may take.
    pub(in crate::worker) lease_ms: Millis,
    /// How many more it takes before it looks again (a claim's size, less its queue).
    pub(in crate::worker) room: u32,
}

/// What the partition knows of its endpoint's work waiting in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(in crate::worker) enum Stored {
    /// Something may be waiting: claim to find out.
    #[default]
    Unknown,
    /// A claim that took less than it asked for found nothing else due, and nothing said
    /// otherwise since: the next due time (`None`: nothing waits) is known without claiming
    /// again. At low rates this saves a commit per delivery.
    Drained { next_due: Option<Millis> },
}

/// A partition's knowledge of its endpoint's work, and its terms for claim at intake.
#[derive(Debug, Default)]
pub(in crate::worker) struct Known {
    /// The endpoint got new work since the partition last looked.
    fresh: bool,
    /// The endpoint's settings or state changed since the partition last looked.
    changed: bool,
    /// Deliveries leased to the partition at intake, not yet in its queue.
    inbox: Vec<Claimed>,
    /// While the partition takes deliveries at intake: on what terms.
    open: Option<Open>,
    /// The terms it opens on if the claim under way finds nothing else due (room counted
    /// before that claim's deliveries).
    expected: Option<Open>,
    /// The last op in the store's order of writes through which the partition has claimed
    /// all that was due: intake ops up to it hold nothing new for it.
    seen: u64,
    /// The claim under way was applied finding nothing else due, and no new work came since.
    applied_drained: bool,
    /// What the partition knows of the store, as of its last claim.
    stored: Stored,
    /// The change was taken, and the endpoint not read since: take nothing at intake.
    stale: bool,
}

/// The wakers' side: intake, the engine and the store's writer thread.
impl Known {
    /// The endpoint got new work.
    pub(in crate::worker) fn work(&mut self) {
        self.applied_drained = false;
        self.fresh = true;
    }

    /// New work from op `seq` in the store's order of writes (0: unordered). True when it
    /// is news (and the partition should be woken): not when a claim already took
    /// everything due after it.
    pub(in crate::worker) fn work_after(&mut self, seq: u64) -> bool {
        let news = seq == 0 || seq > self.seen;
        if news {
            self.work();
        }
        news
    }

    /// The endpoint changed: nothing more is leased to it at intake until it has been read
    /// again.
    pub(in crate::worker) fn changed(&mut self) {
        self.expected = None;
        self.open = None;
        self.changed = true;
    }

    /// A delivery leased to the partition at intake. Unlike [`Known::work`], it says
    /// nothing new is waiting in the store.
    pub(in crate::worker) fn hand(&mut self, claimed: Claimed) {
        self.inbox.push(claimed);
    }

    /// The store applied a claim of this partition, op `seq`, that took `claimed`
    /// deliveries and found nothing else due. Every write before it is seen (news about
    /// them is not news), and the partition opens on the terms it expected, in the store's
    /// order of writes, so the very next intake op hands its deliveries over rather than
    /// queueing them for yet another claim.
    pub(in crate::worker) fn claimed(&mut self, seq: u64, claimed: usize) {
        self.seen = self.seen.max(seq);
        self.fresh = false;
        self.applied_drained = true;
        let Some(mut terms) = self.expected.take() else { return };
        terms.room = terms.room.saturating_sub(claimed as u32);
        if terms.room > 0 {
            self.open = Some(terms);
        }
    }

    /// The lease for one more delivery made at `now`, if the partition takes it.
    pub(in crate::worker) fn lease(&mut self, now: Millis) -> Option<Millis> {
        let terms = self.open.as_mut().filter(|o| o.room > 0 && now < o.held_until)?;
        terms.room -= 1;
        Some(now + terms.lease_ms)
    }
}

/// The partition's side.
impl Known {
    /// Takes the news of new work; the next due time is then no longer known.
    pub(in crate::worker) fn take_fresh(&mut self) -> bool {
        let fresh = std::mem::take(&mut self.fresh);
        if fresh {
            self.stored = Stored::Unknown;
        }
        fresh
    }

    /// Takes the news of a change: the endpoint is stale until read again, and the next due
    /// time is no longer known.
    pub(in crate::worker) fn take_changed(&mut self) -> bool {
        let changed = std::mem::take(&mut self.changed);
        if changed {
            self.stale = true;
            self.stored = Stored::Unknown;
        }
        changed
    }

    /// Has the endpoint changed since the partition last took the news?
    pub(in crate::worker) fn has_changed(&self) -> bool {
        self.changed
    }

    /// What the partition knows of the store.
    pub(in crate::worker) fn stored(&self) -> Stored {
        self.stored
    }

    /// Is the endpoint as last read out of date: a change taken and not read since, or
    /// announced and not yet taken (the partition's loop takes it at its next turn; until
    /// then nothing is sent or leased on the old settings: a secret rotated, a URL changed).
    pub(in crate::worker) fn stale(&self) -> bool {
        self.stale || self.changed
    }

    /// The endpoint was read again: true when it had been stale.
    pub(in crate::worker) fn read(&mut self) -> bool {
        std::mem::take(&mut self.stale)
    }

    pub(in crate::worker) fn take_inbox(&mut self) -> Vec<Claimed> {
        std::mem::take(&mut self.inbox)
    }

    /// Takes nothing more at intake (handing back, retiring, gone).
    pub(in crate::worker) fn close(&mut self) {
        self.open = None;
    }

    /// Closes to intake and says the partition may retire, unless deliveries were leased to
    /// it at intake meanwhile (then it goes on).
    pub(in crate::worker) fn retire(&mut self) -> bool {
        if !self.inbox.is_empty() {
            return false;
        }
        self.open = None;
        true
    }

    /// Terms for a partition whose lease holds until `held_until`, with `queued`
    /// deliveries in its queue, each lease long enough to send `ahead` more besides: room
    /// for a claim's size less what waits (queue and inbox). `claim(n)` gives a claim's
    /// size and lease length with `n` queued. None while the endpoint changed unread or
    /// was halted, or when there is no room.
    pub(in crate::worker) fn terms(
        &self,
        held_until: Millis,
        queued: u32,
        ahead: u32,
        halted: bool,
        claim: impl FnOnce(u32) -> (u32, Millis),
    ) -> Option<Open> {
        if self.stale() || halted {
            return None;
        }
        let waiting = queued + self.inbox.len() as u32;
        let (limit, lease_ms) = claim(waiting + ahead);
        let room = limit.checked_sub(waiting).filter(|r| *r > 0)?;
        Some(Open { held_until, lease_ms, room })
    }

    /// The terms to open on now: only while nothing of the endpoint is known to wait in
    /// the store (so nothing new overtakes it). See [`Known::terms`].
    pub(in crate::worker) fn open_terms(
        &self,
        held_until: Millis,
        queued: u32,
        halted: bool,
        claim: impl FnOnce(u32) -> (u32, Millis),
    ) -> Option<Open> {
        match self.stored {
            Stored::Drained { .. } => self.terms(held_until, queued, 0, halted, claim),
            Stored::Unknown => None,
        }
    }

    /// Opens the partition to intake on `terms`, or closes it (`None`). A halted endpoint
    /// also drops the terms a claim under way would open on. While `claiming` (a prefetch
    /// under way) that may open the partition as it is applied, a close is left to it.
    pub(in crate::worker) fn publish(&mut self, terms: Option<Open>, halted: bool, claiming: bool) {
        if halted {
            self.expected = None;
        } else if terms.is_none() && self.stored == Stored::Unknown && claiming && self.expected.is_some() {
            return;
        }
        self.open = terms;
    }

    /// A claim is about to be submitted: the terms to open on if it finds nothing else due
    /// (`None`: stay as it is; see [`Known::claimed`]).
    pub(in crate::worker) fn expect(&mut self, terms: Option<Open>) {
        self.applied_drained = false;
        self.expected = terms;
    }

    /// The claim answered (or the endpoint changed): forgets terms it did not use.
    pub(in crate::worker) fn forget_terms(&mut self) {
        self.expected = None;
    }

    /// A prefetch claim answered; `short`: it committed and took less than it asked for.
    /// Nothing else waits when it was also applied drained with no news since.
    pub(in crate::worker) fn prefetched(&mut self, short: bool, next_due: Option<Millis>) {
        if short && std::mem::take(&mut self.applied_drained) {
            self.stored = Stored::Drained { next_due };
        }
    }

    /// A refill claim answered: `short` (less than it asked for) says nothing else was due.
    pub(in crate::worker) fn refilled(&mut self, short: bool, next_due: Option<Millis>) {
        self.stored = if short { Stored::Drained { next_due } } else { Stored::Unknown };
    }

    /// Deliveries were handed back to the store, or a timer ran out: claim to find out.
    pub(in crate::worker) fn forget_due(&mut self) {
        self.stored = Stored::Unknown;
    }

    /// Before claiming: is the next due time known without a claim? It is the drained
    /// claim's answer or `again()` (a retry or hand-back an attempt scheduled since, read
    /// only while drained), whichever is sooner; unknown once it has come (at or before
    /// `now`) or the endpoint was halted.
    pub(in crate::worker) fn next_due(
        &mut self,
        now: Millis,
        halted: bool,
        again: impl FnOnce() -> Option<Millis>,
    ) -> Stored {
        let Stored::Drained { next_due } = self.stored else { return Stored::Unknown };
        let again = again();
        let next = next_due.map_or(again, |n| Some(again.map_or(n, |a| a.min(n))));
        self.stored =
            if halted || next.is_some_and(|t| t <= now) { Stored::Unknown } else { Stored::Drained { next_due: next } };
        self.stored
    }
}

#[cfg(test)]
mod tests;
