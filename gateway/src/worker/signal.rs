//! What a partition shares: with its in-flight attempts (`Shared`), with whoever wakes it
//! (`Signal`), and with each attempt of one claim (`Target`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::metrics::TenantCounters;
use crate::model::{Endpoint, Millis};
use crate::pace::Pacer;
use crate::schedule::RetryPolicy;
use crate::sign::Secret;
use crate::store::Claimed;

/// What a partition shares with its in-flight attempts.
pub(in crate::worker) struct Shared {
    pub(in crate::worker) pacer: Mutex<Pacer>,
    pub(in crate::worker) freed: Notify,
    /// The endpoint was held for a human or disabled: stop sending.
    pub(in crate::worker) halted: AtomicBool,
    pub(in crate::worker) failing_since: Mutex<Option<Millis>>,
    /// The earliest time a finished attempt left its delivery due again (a retry, a hand
    /// back), since the partition last looked.
    pub(in crate::worker) due_again: Mutex<Option<Millis>>,
    /// Attempts started and not yet recorded: their requests may be over, but a retry
    /// they schedule is not known until they are.
    settling: AtomicUsize,
}

impl Shared {
    pub(in crate::worker) fn new(pacer: Pacer, failing_since: Option<Millis>) -> Shared {
        Shared {
            pacer: Mutex::new(pacer),
            freed: Notify::new(),
            halted: AtomicBool::new(false),
            failing_since: Mutex::new(failing_since),
            due_again: Mutex::new(None),
            settling: AtomicUsize::new(0),
        }
    }

    /// An attempt took a pacer slot and starts; it ends with [`Shared::settled`].
    pub(in crate::worker) fn attempt_started(&self) {
        self.settling.fetch_add(1, Ordering::AcqRel);
    }

    /// An attempt's request is over and judged: its pacer slot is free for the next
    /// request while its result commits (`max_in_flight` counts requests, not commits).
    pub(in crate::worker) fn request_done(&self) {
        self.pacer.lock().expect("pacer").release();
        self.freed.notify_one();
    }

    /// An attempt's result is recorded, leaving its delivery due again at `again` (a
    /// retry, a hand back). The partition is woken to plan for it, or, if this was the
    /// last attempt settling, to start its linger now rather than at its next scan.
    pub(in crate::worker) fn settled(&self, again: Option<Millis>) {
        if let Some(at) = again {
            let mut due = self.due_again.lock().expect("due again");
            *due = Some(due.map_or(at, |d| d.min(at)));
        }
        let last = self.settling.fetch_sub(1, Ordering::AcqRel) == 1;
        if again.is_some() || last {
            self.freed.notify_one();
        }
    }

    /// Is a request in flight, or a result not yet recorded? An attempt counts from its
    /// spawn (in the partition's step that took its pacer slot) until after it frees the
    /// slot, so this covers both.
    pub(in crate::worker) fn busy(&self) -> bool {
        self.settling.load(Ordering::Acquire) > 0
    }
}

/// How a partition is woken.
#[derive(Default)]
pub(in crate::worker) struct Signal {
    /// The endpoint got new work since the partition last looked.
    fresh: AtomicBool,
    pub(in crate::worker) work: Notify,
    /// The endpoint's settings or state changed: re-read it before the next send.
    changed: AtomicBool,
    pub(in crate::worker) change: Notify,
    /// Deliveries leased to the partition at intake, not yet in its queue.
    inbox: Mutex<Vec<Claimed>>,
    /// While the partition takes deliveries at intake: on what terms.
    open: Mutex<Option<Open>>,
    /// The terms it opens on if the claim it is waiting for finds nothing else due (room
    /// counted before that claim's deliveries).
    pending: Mutex<Option<Open>>,
    /// The last op in the store's order of writes through which the partition has claimed
    /// all that was due: intake ops up to it hold nothing new for it.
    seen: AtomicU64,
    /// The claim under way found nothing else due, and no new work came since.
    drained: AtomicBool,
}

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

impl Signal {
    /// The endpoint got new work: a partition that knew its next due time claims again.
    pub(in crate::worker) fn work(&self) {
        self.drained.store(false, Ordering::Release);
        self.fresh.store(true, Ordering::Release);
        self.work.notify_one();
    }

    /// New work from op `seq` in the store's order of writes (0: unordered): news unless
    /// a claim already took everything due after it.
    pub(in crate::worker) fn work_after(&self, seq: u64) {
        if seq == 0 || seq > self.seen.load(Ordering::Acquire) {
            self.work();
        }
    }

    pub(in crate::worker) fn take_fresh(&self) -> bool {
        self.fresh.swap(false, Ordering::AcqRel)
    }
    /// The endpoint changed: wakes the partition from any wait, even the pacer's (a wait
    /// planned at the old rate can be far longer than the new one allows).
    pub(in crate::worker) fn changed(&self) {
        // Nothing more is leased to it at intake until it has read the endpoint again.
        self.forget_terms();
        self.set_open(None);
        self.changed.store(true, Ordering::Release);
        self.change.notify_one();
    }

    /// Wakes the partition so it sees the engine stopping.
    pub(in crate::worker) fn stop(&self) {
        self.work.notify_one();
        self.change.notify_one();
    }

    pub(in crate::worker) fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::AcqRel)
    }

    /// Has the endpoint changed since the partition last took the news?
    pub(in crate::worker) fn has_changed(&self) -> bool {
        self.changed.load(Ordering::Acquire)
    }

    /// A delivery leased to this partition at intake: queued for it, and the partition
    /// woken. Unlike [`Signal::work`], it says nothing new is waiting in the store.
    pub(in crate::worker) fn hand(&self, claimed: Claimed) {
        self.inbox.lock().expect("inbox").push(claimed);
        self.work.notify_one();
    }

    pub(in crate::worker) fn take_inbox(&self) -> Vec<Claimed> {
        std::mem::take(&mut *self.inbox.lock().expect("inbox"))
    }

    pub(in crate::worker) fn inbox_len(&self) -> usize {
        self.inbox.lock().expect("inbox").len()
    }

    /// Opens (`Some`) or closes the partition to deliveries leased at intake.
    pub(in crate::worker) fn set_open(&self, open: Option<Open>) {
        *self.open.lock().expect("open") = open;
    }

    /// A claim is about to be submitted: sets the terms to open on if it finds nothing
    /// else due (`None`: stay closed; see [`Signal::claimed`]).
    pub(in crate::worker) fn expect(&self, terms: Option<Open>) {
        self.drained.store(false, Ordering::Release);
        *self.pending.lock().expect("pending") = terms;
    }

    /// The claim answered (or the endpoint changed): forgets terms it did not use.
    pub(in crate::worker) fn forget_terms(&self) {
        *self.pending.lock().expect("pending") = None;
    }

    /// Is a claim under way that may open the partition as it is applied?
    pub(in crate::worker) fn expecting(&self) -> bool {
        self.pending.lock().expect("pending").is_some()
    }

    /// Did the last claim find nothing else due, with no new work since? Only a store
    /// that orders its writes says so (see [`Signal::claimed`]).
    pub(in crate::worker) fn take_drained(&self) -> bool {
        self.drained.swap(false, Ordering::AcqRel)
    }

    /// The store applied a claim of this partition, op `seq`, that took `claimed`
    /// deliveries and found nothing else due. Every write before it is seen (news about
    /// them is not news), and the partition opens on the terms it expected, in the store's
    /// order of writes, so the very next intake op hands its deliveries over rather than
    /// queueing them for yet another claim.
    pub(in crate::worker) fn claimed(&self, seq: u64, claimed: usize) {
        self.seen.fetch_max(seq, Ordering::AcqRel);
        self.fresh.store(false, Ordering::Release);
        self.drained.store(true, Ordering::Release);
        let Some(mut terms) = self.pending.lock().expect("pending").take() else { return };
        terms.room = terms.room.saturating_sub(claimed as u32);
        if terms.room > 0 {
            self.set_open(Some(terms));
        }
    }

    /// The lease for one more delivery made at `now`, if the partition takes it.
    pub(in crate::worker) fn lease(&self, now: Millis) -> Option<Millis> {
        let mut open = self.open.lock().expect("open");
        let terms = open.as_mut().filter(|o| o.room > 0 && now < o.held_until)?;
        terms.room -= 1;
        Some(now + terms.lease_ms)
    }
}

/// What an attempt needs to know about its endpoint, fixed for one claim.
pub(in crate::worker) struct Target {
    pub(in crate::worker) endpoint: Endpoint,
    pub(in crate::worker) policy: RetryPolicy,
    pub(in crate::worker) secrets: Vec<Secret>,
    /// The tenant's outcome counters, looked up once per partition rather than per result.
    pub(in crate::worker) counters: TenantCounters,
}
