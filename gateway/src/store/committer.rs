//! The group committer: callers submit writes concurrently, and whatever is waiting is
//! folded into one transaction, each caller answered after the commit.

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
/// committed after some failed: the database came back). Read by `/metrics`.
#[derive(Debug, Default)]
pub struct CommitHealth {
    failures: AtomicU64,
    recoveries: AtomicU64,
    failing: AtomicBool,
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

    fn note(&self, committed: bool) {
        if committed {
            if self.failing.swap(false, Ordering::AcqRel) {
                self.recoveries.fetch_add(1, Ordering::Relaxed);
                tracing::info!("the store takes writes again");
            }
        } else {
            self.failures.fetch_add(1, Ordering::Relaxed);
            self.failing.store(true, Ordering::Release);
        }
    }
}

#[derive(Clone)]
enum Queue {
    /// A task folds waiting writes into one [`Engine::apply`](crate::store::Engine::apply).
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
    pub async fn submit_all(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        let stopped = || StoreError::backend("committer stopped");
        let (reply, rx) = oneshot::channel();
        match &self.queue {
            Queue::Loop(tx) => tx.send((ops, reply)).await.map_err(|_| stopped())?,
            Queue::Direct(sink) => sink.send((ops, reply)).map_err(|_| stopped())?,
        }
        let answer = rx.await.map_err(|_| stopped())?;
        self.health.note(answer.is_ok());
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

    pub async fn ingest(&self, events: Vec<NewEvent>) -> Result<Vec<IngestOutcome>> {
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
        let (ops, replies) = fold(batch.drain(..));
        let started = std::time::Instant::now();
        let size = ops.len();
        let applied = store.apply(ops).await;
        tracing::trace!(ops = size, micros = started.elapsed().as_micros() as u64, "group commit");
        if !answer(replies, applied) {
            // Do not spin on a broken database.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
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
