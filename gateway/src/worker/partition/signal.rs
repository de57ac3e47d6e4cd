//! What a partition shares: with its in-flight attempts (`Shared`), with whoever wakes it
//! (`Signal`), and with each attempt of one claim (`Target`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use crate::metrics::TenantCounters;
use crate::model::{Endpoint, Millis};
use crate::pace::Pacer;
use crate::schedule::RetryPolicy;
use crate::sign::Secret;

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
}

impl Shared {
    /// A finished attempt's delivery is due again at `at`.
    pub(in crate::worker) fn due_again(&self, at: Millis) {
        let mut due = self.due_again.lock().expect("due again");
        *due = Some(due.map_or(at, |d| d.min(at)));
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
}

impl Signal {
    /// The endpoint got new work: a partition that knew its next due time claims again.
    pub(in crate::worker) fn work(&self) {
        self.fresh.store(true, Ordering::Release);
        self.work.notify_one();
    }

    pub(in crate::worker) fn take_fresh(&self) -> bool {
        self.fresh.swap(false, Ordering::AcqRel)
    }
    /// The endpoint changed: wakes the partition from any wait, even the pacer's (a wait
    /// planned at the old rate can be far longer than the new one allows).
    pub(in crate::worker) fn changed(&self) {
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
}

/// What an attempt needs to know about its endpoint, fixed for one claim.
pub(in crate::worker) struct Target {
    pub(in crate::worker) endpoint: Endpoint,
    pub(in crate::worker) policy: RetryPolicy,
    pub(in crate::worker) secrets: Vec<Secret>,
    /// The tenant's outcome counters, looked up once per partition rather than per result.
    pub(in crate::worker) counters: TenantCounters,
}
