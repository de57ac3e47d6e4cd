//! The group committer: callers submit writes concurrently, and whatever is waiting is
//! folded into one transaction, each caller answered after the commit.
//!
//! Every hot-path write goes through it: intake, claims, results, releases and endpoint
//! state. It counts failed writes and recoveries (`CommitHealth`) for `/metrics`, and while
//! the store cannot be reached it lets one intake request at a time find out whether it is
//! back. An attempt's result that cannot commit because the database is out of reach
//! (`StoreError::is_unavailable`) is tried again until it commits or its fence refuses it
//! (`worker/attempt.rs::record_until_stored`). On Postgres, under load, the results of
//! finished deliveries commit in a second transaction beside each commit, since they read
//! nothing it writes (`split`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::engine::partition_result;
use super::*;

/// Group commit: callers submit writes concurrently; whatever is waiting (up to
/// `max_batch` ops) commits as one transaction, and each caller is answered after it.
#[derive(Clone)]
pub struct Committer {
    queue: Queue,
    health: Arc<CommitHealth>,
}

/// How the writes through the committer fared: failures, and recoveries (a write that
/// committed after some failed: the database came back). Read by `/metrics`. Also gates
/// intake while the store cannot be reached ([`CommitHealth::admit`]).
#[derive(Debug, Default)]
pub struct CommitHealth {
    failures: AtomicU64,
    recoveries: AtomicU64,
    refused_untried: AtomicU64,
    failing: AtomicBool,
    /// The last write failed because the store could not be reached.
    unreachable: AtomicBool,
    /// A write admitted while unreachable is on its way: the others are refused.
    probing: AtomicBool,
}

impl CommitHealth {
    /// Writes that failed (every caller of a failed group commit counts).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Times a write committed after writes had failed.
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Relaxed)
    }

    /// Intake requests refused without trying while the store could not be reached.
    pub fn refused_untried(&self) -> u64 {
        self.refused_untried.load(Ordering::Relaxed)
    }

    fn note(&self, answer: Result<(), &StoreError>) {
        match answer {
            Ok(()) => {
                self.unreachable.store(false, Ordering::Release);
                if self.failing.swap(false, Ordering::AcqRel) {
                    self.recoveries.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("the store takes writes again");
                }
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                self.failing.store(true, Ordering::Release);
                if e.is_unavailable() && !self.unreachable.swap(true, Ordering::AcqRel) {
                    tracing::warn!(error = %e, "the store cannot be reached: intake answers 503 at once, one request at a time finding out whether it is back");
                }
            }
        }
    }

    /// Whether a write that may be refused (intake) goes ahead. While the store is reachable,
    /// always. While the last write could not reach it, one at a time: each would wait out
    /// the connection pool's timeout (10 s) behind the others, and a producer is better
    /// served by a `503` at once. The one admitted finds out whether the store is back; its
    /// success opens the gate for all (as any other write's does, such as the engine's).
    fn admit(&self) -> Option<Admitted<'_>> {
        if !self.unreachable.load(Ordering::Acquire) {
            return Some(Admitted(None));
        }
        if self.probing.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return Some(Admitted(Some(&self.probing)));
        }
        self.refused_untried.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// A write let through [`CommitHealth::admit`]; while the store is unreachable, the one
/// finding out (the next may go once it is answered).
struct Admitted<'a>(Option<&'a AtomicBool>);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(probing) = self.0 {
            probing.store(false, Ordering::Release);
        }
    }
}

#[derive(Clone)]
enum Queue {
    /// A task folds waiting writes into one [`Engine::apply`](crate::store::Engine::apply),
    /// or two side by side under load (see [`split`]).
    Loop(mpsc::Sender<Pending>),
    /// The store batches on a thread of its own (SQLite's writer): one hop less per commit.
    Direct(Arc<dyn CommitSink>),
}

/// A store's own group-commit queue (see [`Engine::commit_sink`](crate::store::Engine::commit_sink)). It must commit each
/// `Pending`'s ops in order, in one transaction, and answer it after that commit.
pub trait CommitSink: Send + Sync {
    /// Queues writes; gives them back if the store has stopped.
    fn send(&self, pending: Pending) -> std::result::Result<(), Pending>;
}

/// Writes that commit together, and who waits for them.
pub type Pending = (Vec<WriteOp>, oneshot::Sender<Result<Vec<WriteResult>>>);

impl Committer {
    /// Starts group commits on `store`: its own queue when it has one, otherwise a commit
    /// loop that ends when every `Committer` clone is dropped.
    pub fn start(store: DynStore, max_batch: usize) -> Committer {
        let health = Arc::default();
        if let Some(sink) = store.commit_sink(max_batch) {
            return Committer { queue: Queue::Direct(sink), health };
        }
        let (tx, rx) = mpsc::channel(max_batch * 4);
        tokio::spawn(commit_loop(store, rx, max_batch));
        Committer { queue: Queue::Loop(tx), health }
    }

    /// Counts this committer's failures and recoveries in `health` (before it is cloned).
    pub fn reporting_to(mut self, health: Arc<CommitHealth>) -> Committer {
        self.health = health;
        self
    }

    /// Submits one write and waits until it is committed (or failed).
    pub async fn submit(&self, op: WriteOp) -> Result<WriteResult> {
        self.submit_all(vec![op]).await?.pop().ok_or_else(|| StoreError::backend("committer answered nothing"))
    }

    /// Submits writes that commit in the same transaction, in order, and waits for them.
    /// An API request's intake or endpoint change carries the request's audit entry along
    /// (see [`audit`](super::audit)), answered apart.
    pub async fn submit_all(&self, mut ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        let audited = match ops.iter().any(|op| matches!(op, WriteOp::Ingest(_) | WriteOp::Endpoint(_))) {
            true => audit::pending(),
            false => None,
        };
        let Some(entry) = audited else { return self.submit_ops(ops).await };
        ops.push(WriteOp::Audit(Box::new(entry)));
        let mut results = self.submit_ops(ops).await?;
        if let Some(WriteResult::Audit(true)) = results.pop() {
            audit::written();
        }
        Ok(results)
    }

    async fn submit_ops(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        let stopped = || StoreError::backend("committer stopped");
        let (reply, rx) = oneshot::channel();
        match &self.queue {
            Queue::Loop(tx) => tx.send((ops, reply)).await.map_err(|_| stopped())?,
            Queue::Direct(sink) => sink.send((ops, reply)).map_err(|_| stopped())?,
        }
        let answer = rx.await.map_err(|_| stopped())?;
        self.health.note(answer.as_ref().map(drop));
        answer
    }

    /// Records one attempt's result together with its endpoint's change (applied first, so
    /// the result settles against the endpoint's new state). True when the fence held.
    pub async fn record_with(&self, change: Option<EndpointChange>, result: AttemptResult) -> Result<Recorded> {
        let ops = change.map(WriteOp::Endpoint).into_iter().chain([WriteOp::Record(vec![result])]).collect();
        let mut results = self.submit_all(ops).await?;
        let settled = match results.pop() {
            Some(WriteResult::Record(v)) => v.first().copied().flatten(),
            other => return Err(StoreError::backend(format!("committer answered with the wrong kind: {other:?}"))),
        };
        let dead_lettered = match results.pop() {
            Some(WriteResult::Endpoint(n)) => n,
            _ => 0,
        };
        Ok(Recorded { settled, dead_lettered })
    }

    /// Stores events; refused at once (`StoreError::Unreachable`) while the store cannot be
    /// reached and another intake is finding out whether it is back.
    pub async fn ingest(&self, events: Vec<NewEvent>) -> Result<Vec<IngestOutcome>> {
        let Some(_admitted) = self.health.admit() else { return Err(StoreError::Unreachable) };
        match self.submit(WriteOp::Ingest(events)).await? {
            WriteResult::Ingest(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    pub async fn claim(&self, req: ClaimRequest) -> Result<Vec<Claimed>> {
        match self.submit(WriteOp::Claim(req)).await? {
            WriteResult::Claim(batch) => Ok(batch.claimed),
            other => Err(unexpected(other)),
        }
    }

    /// Claims under `owner`'s partition lease on `req.endpoint`, first taking or renewing
    /// the lease until `renew` when given, in one commit: `None` when another owner holds
    /// the partition. Without `renew`, the lease is checked, not written.
    pub async fn claim_in_partition(&self, req: ClaimRequest, renew: Option<Millis>) -> Result<Option<ClaimBatch>> {
        let lease = renew.map(|until| PartitionLease {
            endpoint: req.endpoint.clone(),
            owner: req.owner.clone(),
            now: req.now,
            until: Some(until),
        });
        let claim = WriteOp::Claim(ClaimRequest { in_partition: true, ..req });
        let ops = lease.map(WriteOp::Partition).into_iter().chain([claim]).collect();
        match self.submit_all(ops).await?.as_mut_slice() {
            [WriteResult::Partition(false), _] => Ok(None),
            [WriteResult::Partition(true), WriteResult::Claim(v)] | [WriteResult::Claim(v)] => {
                Ok(Some(std::mem::take(v)))
            }
            other => Err(StoreError::backend(format!("committer answered {other:?}"))),
        }
    }

    /// Takes or renews an endpoint's partition lease, riding the next group commit.
    pub async fn hold_partition(&self, lease: PartitionLease) -> Result<bool> {
        partition_result(Some(self.submit(WriteOp::Partition(lease)).await?))
    }

    /// Records attempt results; per result, whether it was accepted (the fence held).
    pub async fn record(&self, results: Vec<AttemptResult>) -> Result<Vec<bool>> {
        match self.submit(WriteOp::Record(results)).await? {
            WriteResult::Record(v) => Ok(v.iter().map(Option::is_some).collect()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn release(&self, releases: Vec<Release>) -> Result<()> {
        self.submit(WriteOp::Release(releases)).await.map(drop)
    }

    pub async fn change_endpoint(&self, change: EndpointChange) -> Result<u64> {
        match self.submit(WriteOp::Endpoint(change)).await? {
            WriteResult::Endpoint(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(r: WriteResult) -> StoreError {
    StoreError::backend(format!("committer answered with the wrong kind: {r:?}"))
}

async fn commit_loop(store: DynStore, mut rx: mpsc::Receiver<Pending>, max_batch: usize) {
    let mut batch: Vec<Pending> = Vec::with_capacity(max_batch);
    while rx.recv_many(&mut batch, max_batch).await > 0 {
        let started = std::time::Instant::now();
        let size: usize = batch.iter().map(|p| p.0.len()).sum();
        let (side, main) = split(std::mem::take(&mut batch));
        let committed = match side {
            None => {
                let (ops, replies) = fold(main);
                answer(replies, store.apply(ops).await)
            }
            Some(side) => {
                let ((ops, replies), (side_ops, side_replies)) = (fold(main), fold(side));
                let (applied, side_applied) = tokio::join!(store.apply(ops), store.apply(side_ops));
                answer(replies, applied) & answer(side_replies, side_applied)
            }
        };
        tracing::trace!(ops = size, micros = started.elapsed().as_micros() as u64, "group commit");
        if !committed {
            // Do not spin on a broken database.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Results of finished deliveries in one group commit from which on they commit in a
/// transaction of their own, beside the rest's, instead of after it.
const SIDE_BY_SIDE_FROM: usize = 200;

/// Splits a group commit in two when it carries many results of finished deliveries
/// (delivered, or dead without an endpoint change) beside other writes: those results,
/// to commit in a transaction of their own at the same time as the rest's. Under load
/// they were more than half of each commit's time, and intake (which a producer waits
/// for) queued behind them; two transactions side by side take the time of the longer.
/// At a moderate rate a commit carries a few, and one transaction costs the database less
/// than two.
///
/// Only those results: such a result reads nothing the other transaction writes. It sets
/// its own delivery's row, checked by its fence and its `delivering` state, and a write of
/// that row in the other transaction (a hand-back, a deleted endpoint) waits for its lock
/// and then re-reads it, so the two settle as if applied one after the other. A result
/// that may wait or retry settles against its endpoint's state, and one that carries an
/// endpoint change moves the endpoint's other deliveries: both stay with the rest, where
/// a disable and a hand-back applied side by side once left deliveries queued on a
/// disabled endpoint, each settling against the endpoint as it was before the other.
fn split(batch: Vec<Pending>) -> (Option<Vec<Pending>>, Vec<Pending>) {
    let finished: Vec<Option<usize>> = batch.iter().map(|(ops, _)| finished_results(ops)).collect();
    let results: usize = finished.iter().flatten().sum();
    if results < SIDE_BY_SIDE_FROM || finished.iter().all(Option::is_some) {
        // In the order it came: one transaction applies its ops in order.
        return (None, batch);
    }
    let (mut side, mut main) = (Vec::new(), Vec::new());
    for (pending, finished) in batch.into_iter().zip(finished) {
        match finished {
            Some(_) => side.push(pending),
            None => main.push(pending),
        }
    }
    (Some(side), main)
}

/// How many results `ops` carry when they are results of finished deliveries alone (see
/// [`split`]); `None` when they are anything else.
fn finished_results(ops: &[WriteOp]) -> Option<usize> {
    let mut n = 0;
    for op in ops {
        match op {
            WriteOp::Record(results)
                if results.iter().all(|r| matches!(r.state, DeliveryState::Delivered | DeliveryState::Dead)) =>
            {
                n += results.len()
            }
            _ => return None,
        }
    }
    (n > 0).then_some(n)
}

/// Who waits for how many of a group commit's results.
pub type Replies = Vec<(usize, oneshot::Sender<Result<Vec<WriteResult>>>)>;

/// Folds waiting writes into one commit's ops, in order, and who waits for them.
pub fn fold(groups: impl IntoIterator<Item = Pending>) -> (Vec<WriteOp>, Replies) {
    let (mut ops, mut replies) = (Vec::new(), Vec::new());
    for (group, reply) in groups {
        replies.push((group.len(), reply));
        ops.extend(group);
    }
    (ops, replies)
}

/// Answers each caller of a group commit with its own results, or every one with its
/// failure (logged once). True when it committed.
pub fn answer(replies: Replies, applied: Result<Vec<WriteResult>>) -> bool {
    match applied {
        Ok(results) => {
            let mut results = results.into_iter();
            for (n, reply) in replies {
                let _ = reply.send(Ok(results.by_ref().take(n).collect()));
            }
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "group commit failed");
            for (_, reply) in replies {
                let _ = reply.send(Err(e.clone()));
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(n: usize, state: DeliveryState) -> AttemptResult {
        let delivery = DeliveryId::from_stored(format!("dl_{n}"));
        let attempt = Attempt {
            id: format!("at_{n}"),
            delivery_id: delivery.clone(),
            number: 1,
            started_at: 0,
            duration_ms: 1,
            status: Some(200),
            response_body: None,
            error: None,
            verdict: "delivered".into(),
            decided_by: "default".into(),
            request: None,
        };
        AttemptResult { delivery, fence: 1, state, next_attempt_at: None, reason: None, attempt, ordered: false }
    }

    fn pending(ops: Vec<WriteOp>) -> Pending {
        (ops, oneshot::channel().0)
    }

    fn results(n: usize, state: DeliveryState) -> Vec<Pending> {
        (0..n).map(|i| pending(vec![WriteOp::Record(vec![result(i, state)])])).collect()
    }

    /// The kinds of a list of pendings' ops, in order.
    fn kinds(groups: &[Pending]) -> Vec<String> {
        let kind = |op: &WriteOp| match op {
            WriteOp::Record(rs) => {
                format!("record:{}", rs.iter().map(|r| r.state.as_str()).collect::<Vec<_>>().join("+"))
            }
            WriteOp::Release(_) => "release".into(),
            other => format!("{other:?}"),
        };
        groups.iter().map(|(ops, _)| ops.iter().map(kind).collect::<Vec<_>>().join(",")).collect()
    }

    #[test]
    fn a_commit_with_few_finished_results_stays_one_transaction_in_its_order() {
        let mut batch = results(SIDE_BY_SIDE_FROM - 1, DeliveryState::Delivered);
        batch.insert(3, pending(vec![WriteOp::Release(vec![])]));
        let before = kinds(&batch);
        let (side, main) = split(batch);
        assert!(side.is_none());
        assert_eq!(kinds(&main), before);
    }

    #[test]
    fn many_finished_results_commit_beside_the_rest_and_nothing_else_does() {
        let mut batch = results(SIDE_BY_SIDE_FROM / 2, DeliveryState::Delivered);
        batch.push(pending(vec![WriteOp::Release(vec![])]));
        batch.extend(results(1, DeliveryState::Waiting));
        batch.push(pending(vec![WriteOp::Release(vec![]), WriteOp::Record(vec![result(0, DeliveryState::Delivered)])]));
        batch.extend(results(SIDE_BY_SIDE_FROM / 2, DeliveryState::Dead));
        let (side, main) = split(batch);
        let side = side.expect("split");
        assert_eq!(side.len(), SIDE_BY_SIDE_FROM);
        assert!(kinds(&side).iter().all(|k| k == "record:delivered" || k == "record:dead"), "{:?}", kinds(&side));
        // A retry, and a result that rides with another write, stay with the rest, in order.
        assert_eq!(kinds(&main), ["release", "record:waiting", "release,record:delivered"]);
    }

    #[test]
    fn finished_results_alone_are_one_transaction() {
        let batch = results(SIDE_BY_SIDE_FROM * 2, DeliveryState::Delivered);
        let (side, main) = split(batch);
        assert!(side.is_none());
        assert_eq!(main.len(), SIDE_BY_SIDE_FROM * 2);
    }

    #[test]
    fn while_the_store_is_unreachable_one_intake_at_a_time_goes_ahead() {
        let health = CommitHealth::default();
        // Reachable: every one goes, at once.
        let (a, b) = (health.admit(), health.admit());
        assert!(a.is_some() && b.is_some());
        drop((a, b));
        // A failure that is not about reaching the store gates nothing.
        health.note(Err(&StoreError::backend("a statement failed")));
        assert!(health.admit().is_some() && health.admit().is_some());
        // Unreachable: one finds out, the others are refused until it is answered.
        health.note(Err(&StoreError::Unreachable));
        let probe = health.admit();
        assert!(probe.is_some());
        assert!(health.admit().is_none() && health.admit().is_none());
        assert_eq!(health.refused_untried(), 2);
        drop(probe);
        let probe = health.admit();
        assert!(probe.is_some(), "the next one goes once the first is answered");
        // A write that commits (this one, or any other) opens the gate for all.
        health.note(Ok(()));
        drop(probe);
        assert!(health.admit().is_some() && health.admit().is_some());
        assert_eq!(health.recoveries(), 1);
    }
}
