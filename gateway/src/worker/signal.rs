//! What a partition shares: with its in-flight attempts (`Shared`, which an attempt sees
//! only through its [`PartitionLink`]), with whoever wakes it and with the store's writer
//! thread (`Signal`, around [`Known`]), and with each attempt of one claim (`Target`, its
//! material opened in [`super::target`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::HUMAN_PAUSE;
use super::known::Known;
use super::target::{OpenError, Opened};
use crate::metrics::TenantCounters;
use crate::model::{Endpoint, Millis};
use crate::pace::Pacer;
use crate::schedule::RetryPolicy;
use crate::sign::Secret;
use crate::sign::v1a::SigningKey;
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

    /// An attempt took a pacer slot and starts: its link back to the partition, which it
    /// ends with [`PartitionLink::settled`].
    pub(in crate::worker) fn attempt_started(self: &Arc<Self>) -> PartitionLink {
        self.settling.fetch_add(1, Ordering::AcqRel);
        PartitionLink(self.clone())
    }

    /// Is a request in flight, or a result not yet recorded? An attempt counts from its
    /// spawn (in the partition's step that took its pacer slot) until after it frees the
    /// slot, so this covers both.
    pub(in crate::worker) fn busy(&self) -> bool {
        self.settling.load(Ordering::Acquire) > 0
    }
}

/// An attempt's side of [`Shared`]: what it tells its partition (its request is over, its
/// result recorded, the endpoint paused or halted, its failing streak). It cannot take a
/// pacer permit, read the queue or claim: an attempt never paces and never claims.
pub(in crate::worker) struct PartitionLink(Arc<Shared>);

impl PartitionLink {
    /// The attempt's request is over and judged: its pacer slot is free for the next
    /// request while its result commits (`max_in_flight` counts requests, not commits).
    pub(in crate::worker) fn request_done(&self) {
        self.0.pacer.lock().expect("pacer").release();
        self.0.freed.notify_one();
    }

    /// The attempt's results are recorded, leaving a delivery due again at `again` (a
    /// retry, a hand back). The partition is woken to plan for it, or, if this was the
    /// last attempt settling, to start its linger now rather than at its next scan.
    pub(in crate::worker) fn settled(self, again: Option<Millis>) {
        let shared = &self.0;
        if let Some(at) = again {
            let mut due = shared.due_again.lock().expect("due again");
            *due = Some(due.map_or(at, |d| d.min(at)));
        }
        let last = shared.settling.fetch_sub(1, Ordering::AcqRel) == 1;
        if again.is_some() || last {
            shared.freed.notify_one();
        }
    }

    /// Reads and changes when the endpoint started failing, under the lock that makes
    /// concurrent attempts see each other's changes.
    pub(in crate::worker) fn failing_since<T>(&self, f: impl FnOnce(&mut Option<Millis>) -> T) -> T {
        f(&mut self.0.failing_since.lock().expect("failing"))
    }

    /// Sends nothing more for `after` (a timed pause).
    pub(in crate::worker) fn pause_for(&self, after: Duration) {
        self.0.pacer.lock().expect("pacer").pause_until(Instant::now() + after);
    }

    /// Sends nothing more until a human acts (the endpoint was held or disabled).
    pub(in crate::worker) fn halt(&self) {
        self.0.halted.store(true, Ordering::Release);
        self.pause_for(HUMAN_PAUSE);
    }
}

/// How a partition is woken, and what it knows of its endpoint's work: the state machine
/// [`Known`] in one mutex, shared by the partition task, the engine's wakes and the store's
/// writer thread (`store::Handoff`). The methods here change it and wake the partition.
#[derive(Default)]
pub(in crate::worker) struct Signal {
    pub(in crate::worker) work: Notify,
    pub(in crate::worker) change: Notify,
    known: Mutex<Known>,
    /// The version of the endpoint as the partition last read it (`None`: not read, or
    /// known to be out of date), which the node's check of versions compares.
    read_version: Mutex<Option<i64>>,
}

impl Signal {
    /// Reads or changes what the partition knows (wakes no one).
    pub(in crate::worker) fn known<T>(&self, f: impl FnOnce(&mut Known) -> T) -> T {
        f(&mut self.known.lock().expect("known"))
    }

    /// New work from op `seq` in the store's order of writes (0: unordered): the partition
    /// is woken unless a claim already took everything due after it.
    pub(in crate::worker) fn work_after(&self, seq: u64) {
        if self.known(|k| k.work_after(seq)) {
            self.work.notify_one();
        }
    }

    /// The endpoint changed: wakes the partition from any wait, even the pacer's (a wait
    /// planned at the old rate can be far longer than the new one allows).
    pub(in crate::worker) fn changed(&self) {
        self.known(Known::changed);
        self.change.notify_one();
    }

    /// The partition read its endpoint at `version` (`None`: it read nothing).
    pub(in crate::worker) fn read_at(&self, version: Option<i64>) {
        *self.read_version.lock().expect("read version") = version;
    }

    /// The version the partition last read, unless already known to be out of date.
    pub(in crate::worker) fn read_version(&self) -> Option<i64> {
        *self.read_version.lock().expect("read version")
    }

    /// The node's check found the endpoint stored at `stored` (`None`: gone): if the
    /// partition read another version, it is told of a change (once: until it reads again,
    /// the check passes it over). True when it was told.
    pub(in crate::worker) fn stored_at(&self, stored: Option<i64>) -> bool {
        let mut read = self.read_version.lock().expect("read version");
        if read.is_none() || *read == stored {
            return false;
        }
        *read = None;
        drop(read);
        self.changed();
        true
    }

    /// Wakes the partition from any wait, to look again at what it holds (the cluster's
    /// membership changed).
    pub(in crate::worker) fn nudge(&self) {
        self.change.notify_one();
    }

    /// Wakes the partition so it sees the engine stopping.
    pub(in crate::worker) fn stop(&self) {
        self.work.notify_one();
        self.change.notify_one();
    }

    /// A delivery leased to this partition at intake: queued for it, and the partition
    /// woken. Unlike new work, it says nothing new is waiting in the store.
    pub(in crate::worker) fn hand(&self, claimed: Claimed) {
        self.known(|k| k.hand(claimed));
        self.work.notify_one();
    }
}

/// What an attempt needs to know about its endpoint, fixed for one claim.
pub(in crate::worker) struct Target {
    pub(in crate::worker) endpoint: Endpoint,
    pub(in crate::worker) policy: RetryPolicy,
    /// Its secrets and sealed material, opened for the claim, and how its requests leave;
    /// `Err`: what does not open (its attempts hold the endpoint).
    pub(in crate::worker) opened: Result<Opened, OpenError>,
    /// The tenant's outcome counters, looked up once per partition rather than per result.
    pub(in crate::worker) counters: TenantCounters,
}

impl Target {
    /// The secrets that sign (none when the endpoint's material does not open: nothing
    /// is sent then).
    pub(in crate::worker) fn secrets(&self) -> &[Secret] {
        self.opened.as_ref().map_or(&[], |o| &o.secrets)
    }

    /// The `v1a` keys that sign (none when the endpoint's material does not open).
    pub(in crate::worker) fn signing_keys(&self) -> &[SigningKey] {
        self.opened.as_ref().map_or(&[], |o| &o.signing_keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pace::Permit;

    /// A partition's shared state whose pacer lets one request fly at a time.
    fn shared() -> Arc<Shared> {
        Arc::new(Shared::new(Pacer::try_new(1000.0, 10, 1).expect("pacer"), None))
    }

    #[test]
    fn an_attempt_is_settling_from_its_start_until_settled_and_leaves_the_earliest_due_time() {
        let sh = shared();
        let (a, b) = (sh.attempt_started(), sh.attempt_started());
        a.settled(Some(300));
        assert!(sh.busy(), "one attempt is still settling");
        b.settled(Some(200));
        assert!(!sh.busy());
        assert_eq!(*sh.due_again.lock().expect("due again"), Some(200));
    }

    #[test]
    fn a_request_done_frees_its_pacer_slot_and_a_halt_stops_sending_until_a_human_acts() {
        let sh = shared();
        let now = Instant::now();
        assert_eq!(sh.pacer.lock().expect("pacer").poll(now), Permit::Go);
        let link = sh.attempt_started();
        assert_eq!(sh.pacer.lock().expect("pacer").poll(now), Permit::Full);
        link.request_done();
        link.halt();
        assert!(sh.halted.load(Ordering::Acquire));
        let permit = sh.pacer.lock().expect("pacer").poll(now);
        assert!(matches!(permit, Permit::Paused(until) if until >= now + HUMAN_PAUSE), "{permit:?}");
        link.settled(None);
    }

    #[test]
    fn a_timed_pause_stops_sending_for_its_time_only() {
        let sh = shared();
        let link = sh.attempt_started();
        let now = Instant::now();
        link.pause_for(Duration::from_secs(30));
        let permit = sh.pacer.lock().expect("pacer").poll(now);
        assert!(matches!(permit, Permit::Paused(until) if until >= now + Duration::from_secs(30)), "{permit:?}");
        assert_eq!(sh.pacer.lock().expect("pacer").poll(now + Duration::from_secs(31)), Permit::Go);
        assert!(!sh.halted.load(Ordering::Acquire));
        link.settled(None);
    }
}
