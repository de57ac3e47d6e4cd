//! The writer thread's loop: jobs of its own, and group commits folded from whatever
//! writes are waiting, each commit synced to disk only when someone is answered for it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rusqlite::Connection;

use super::super::super::*;
use super::{Job, transaction};

/// The longest a commit of attempt results alone waits for another write to join it.
const RESULTS_LINGER_MAX: Duration = Duration::from_millis(10);

/// When writes someone is answered for (intake, endpoint changes) have been committing.
/// Attempt results alone ([`WriteOp::can_wait`]) wait for the next such commit only when
/// it is due soon: at a moderate rate the next event's intake commit then carries the
/// last delivery's result, one commit and one wake-up of the writer instead of two, and
/// the pages both touch written once. Nothing waits on a result but the engine's
/// bookkeeping (the endpoint's slot freed when the response was judged, and a retry's due
/// time is known before it commits); what a crash can take back is bounded by the wait:
/// results of about two intake commits at the current rate, sent again after a restart.
#[derive(Debug, Default)]
pub(super) struct Acknowledged {
    last: Option<Instant>,
    /// The smoothed time between two of them.
    gap: Option<Duration>,
}

impl Acknowledged {
    fn committed(&mut self, at: Instant) {
        if let Some(last) = self.last {
            let gap = at.saturating_duration_since(last);
            self.gap = Some(self.gap.map_or(gap, |g| (g * 3 + gap) / 4));
        }
        self.last = Some(at);
    }

    /// Until when results alone wait for company, at `now`: two usual gaps after the last
    /// acknowledged commit, at most [`RESULTS_LINGER_MAX`] from now; not at all (`now`)
    /// while such commits come further apart than that.
    fn linger_until(&self, now: Instant) -> Instant {
        match (self.last, self.gap) {
            (Some(last), Some(gap)) if gap <= RESULTS_LINGER_MAX => {
                (last + gap * 2).clamp(now, now + RESULTS_LINGER_MAX)
            }
            _ => now,
        }
    }
}

/// What the writer thread takes: a job of its own, or writes to fold into a group commit.
pub(super) enum Work {
    Job(Job),
    Group(Pending),
}

/// The group committer's way in (see [`CommitSink`]).
pub(super) struct Sink(pub(super) mpsc::Sender<Work>);

impl CommitSink for Sink {
    fn send(&self, pending: Pending) -> std::result::Result<(), Pending> {
        self.0.send(Work::Group(pending)).map_err(|e| match e.0 {
            Work::Group(p) => p,
            Work::Job(_) => unreachable!("a group was sent"),
        })
    }
}

/// The writer thread's state.
pub(super) struct Thread {
    pub(super) conn: Connection,
    pub(super) rng: StdRng,
    /// Does the connection sync each commit (`synchronous=FULL`) right now? `None`: unknown.
    pub(super) durable: Option<bool>,
    /// Tells the checkpointer there is WAL to copy back.
    pub(super) dirty: mpsc::SyncSender<()>,
    pub(super) rx: mpsc::Receiver<Work>,
    /// The engine's partitions that take new deliveries at intake, once it has started.
    pub(super) handoff: Arc<OnceLock<Arc<dyn Handoff>>>,
    pub(super) acknowledged: Acknowledged,
}

impl Thread {
    /// Runs until every sender is gone. A job always commits durably (administrative
    /// writes are answered for); a group commit only when one of its writes is.
    pub(super) fn run(mut self, max_batch: &AtomicUsize) {
        let mut next = None;
        while let Some(work) = next.take().or_else(|| self.rx.recv().ok()) {
            match work {
                Work::Job(job) => match self.sync_commits(true) {
                    Ok(()) => job(&mut self.conn, &mut self.rng),
                    // Dropping the job answers its caller that the writer stopped.
                    Err(e) => tracing::error!(error = %e, "cannot make SQLite commits durable"),
                },
                Work::Group(first) => next = self.group_commit(first, max_batch.load(Ordering::Relaxed)),
            }
            let _ = self.dirty.try_send(());
        }
    }

    /// Makes the commits that follow sync to disk (`synchronous=FULL`) or not (`NORMAL`:
    /// the WAL then reaches the disk with the next FULL commit or checkpoint). See
    /// [`WriteOp::acknowledged`] for which commits need it.
    fn sync_commits(&mut self, durable: bool) -> Result<()> {
        if self.durable != Some(durable) {
            self.durable = None;
            self.conn.pragma_update(None, "synchronous", if durable { "FULL" } else { "NORMAL" })?;
            self.durable = Some(durable);
        }
        Ok(())
    }

    /// Commits `first` with whatever else is waiting, up to `max_batch` ops, in one
    /// transaction; answers each caller. Returns a job that arrived in the middle. A
    /// commit of attempt results alone may first wait for company (see [`Acknowledged`]).
    ///
    /// Measured and not taken (`herald-bench`, alternating runs):
    /// - Committing unsynced and syncing the WAL on a thread of its own while the next
    ///   commit runs (answers after that sync): under `concurrent` the node spent more CPU
    ///   per delivery (median 152 against 142 µs), for no more deliveries/s. The sync is
    ///   what lets writes gather; without it commits are smaller and cost more each.
    /// - Results set down beside the queue without waking this thread while it waits for
    ///   company: 0.8 fewer context switches of the writer per event at 500/s, and no less
    ///   CPU (node 0.65 against 0.675 ms per delivery, writer the same).
    fn group_commit(&mut self, first: Pending, max_batch: usize) -> Option<Work> {
        let mut size = first.0.len();
        let mut can_wait = first.0.iter().all(WriteOp::can_wait);
        let mut groups = vec![first];
        let mut interrupted = None;
        let linger_until = self.acknowledged.linger_until(Instant::now());
        while size < max_batch {
            let next = match self.rx.try_recv() {
                Ok(work) => work,
                Err(_) if can_wait => {
                    match self.rx.recv_timeout(linger_until.saturating_duration_since(Instant::now())) {
                        Ok(work) => work,
                        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                    }
                }
                Err(_) => break,
            };
            match next {
                Work::Group(g) => {
                    size += g.0.len();
                    can_wait &= g.0.iter().all(WriteOp::can_wait);
                    groups.push(g);
                }
                job => {
                    interrupted = Some(job);
                    break;
                }
            }
        }
        let (ops, replies) = committer::fold(groups);
        let durable = ops.iter().any(WriteOp::acknowledged);
        let applied = self
            .sync_commits(durable)
            .and_then(|()| transaction(&mut self.conn, ops, &mut self.rng, self.handoff.get().map(|h| &**h)));
        if durable && applied.is_ok() {
            self.acknowledged.committed(Instant::now());
        }
        if !committer::answer(replies, applied) {
            // Do not spin on a broken database.
            std::thread::sleep(Duration::from_millis(50));
        }
        interrupted
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use tokio::sync::oneshot;

    use super::super::super::SqliteStore;
    use super::super::super::checkpoint::connect;
    use super::*;

    /// A writer thread on a fresh store, not running: the test drives its group commits.
    async fn thread_on(dir: &tempfile::TempDir) -> (Thread, mpsc::Sender<Work>) {
        let path = dir.path().join("herald.db");
        drop(SqliteStore::open(&format!("sqlite://{}", path.display()), 1).await.unwrap());
        let (dirty, _checkpoints) = mpsc::sync_channel(1);
        let (work, rx) = mpsc::channel();
        let rng = StdRng::seed_from_u64(1);
        let handoff = Arc::default();
        let thread = Thread {
            conn: connect(&path).unwrap(),
            rng,
            durable: None,
            dirty,
            rx,
            handoff,
            acknowledged: Default::default(),
        };
        (thread, work)
    }

    fn synchronous(t: &Thread) -> i64 {
        t.conn.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0)).unwrap()
    }

    /// Runs one group commit starting with `op`; its answer.
    fn commit(t: &mut Thread, op: WriteOp) -> Vec<WriteResult> {
        let (reply, mut answer) = oneshot::channel();
        assert!(t.group_commit((vec![op], reply), 8).is_none());
        answer.try_recv().expect("answered after the commit").expect("committed")
    }

    fn endpoint_change() -> WriteOp {
        WriteOp::Endpoint(EndpointChange {
            endpoint: EndpointId::from_stored("ep_1"),
            state: None,
            reason: None,
            paused_until: None,
            failing_since: Failing::Recovered,
            by: StateBy::Receiver,
            now: 2,
        })
    }

    /// The durability rule: a commit that someone is answered for (intake, an endpoint
    /// change) syncs to disk; a commit of the engine's bookkeeping alone does not.
    #[tokio::test]
    async fn only_commits_someone_is_answered_for_wait_for_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (mut thread, _work) = thread_on(&dir).await;
        let lease =
            PartitionLease { endpoint: EndpointId::from_stored("ep_1"), owner: "n".into(), now: 1, until: Some(9) };
        commit(&mut thread, WriteOp::Partition(lease));
        assert_eq!(synchronous(&thread), 1, "bookkeeping commits with synchronous=NORMAL");
        commit(&mut thread, endpoint_change());
        assert_eq!(synchronous(&thread), 2, "an answered-for commit syncs (synchronous=FULL)");
    }

    /// A write someone is answered for, already waiting, commits at once and takes
    /// attempt results along, in one synced commit.
    #[tokio::test]
    async fn results_commit_with_a_waiting_answered_write() {
        let dir = tempfile::tempdir().unwrap();
        let (mut thread, work) = thread_on(&dir).await;
        let (reply, mut change) = oneshot::channel();
        work.send(Work::Group((vec![endpoint_change()], reply))).unwrap();
        let results = commit(&mut thread, WriteOp::Record(vec![]));
        assert!(matches!(results.as_slice(), [WriteResult::Record(r)] if r.is_empty()), "{results:?}");
        let change = change.try_recv().expect("the change committed with the results").unwrap();
        assert!(matches!(change.as_slice(), [WriteResult::Endpoint(0)]), "{change:?}");
        assert_eq!(synchronous(&thread), 2, "one commit, synced for the change");
    }

    /// Results alone wait for the next intake commit only when one is due soon: two of the
    /// usual gaps after the last, never past the cap, never while intake is slow or idle.
    #[test]
    fn results_wait_for_an_intake_commit_only_when_one_is_due_soon() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut acks = Acknowledged::default();
        assert_eq!(acks.linger_until(t0), t0, "nothing to wait for before any intake");
        acks.committed(t0);
        assert_eq!(acks.linger_until(t0 + ms(1)), t0 + ms(1), "one commit tells no pace yet");

        // Intake commits every 2 ms: a result 0.2 ms after one waits for the next.
        for i in 1..=8 {
            acks.committed(t0 + ms(2 * i));
        }
        let last = t0 + ms(16);
        assert_eq!(acks.linger_until(last + Duration::from_micros(200)), last + ms(4));
        assert_eq!(acks.linger_until(last + ms(30)), last + ms(30), "intake stopped: no wait");

        // Every 4 ms at first, then a long pause: the gap grows past the cap.
        let mut slow = Acknowledged::default();
        for i in 0..4 {
            slow.committed(t0 + ms(4 * i));
        }
        let last = t0 + ms(12);
        assert_eq!(slow.linger_until(last), last + ms(8), "two gaps of 4 ms");
        slow.committed(last + ms(100));
        let now = last + ms(100) + ms(1);
        assert_eq!(slow.linger_until(now), now, "commits 100 ms apart are not worth waiting for");

        // Never longer than the cap from now.
        let mut steady = Acknowledged::default();
        for i in 0..8 {
            steady.committed(t0 + ms(9 * i));
        }
        let last = t0 + ms(63);
        assert_eq!(steady.linger_until(last), last + RESULTS_LINGER_MAX);
    }
}
