//! Persistence: the `Store` trait, its SQLite and Postgres implementations, and the
//! group committer that folds many concurrent writes into one durable transaction.
//! Architecture invariant: this is the only module that speaks SQL.
//!
//! `Store` is the union of four traits split by caller: `Reads` (API, console, metrics,
//! engine reads; implemented once, generic over sqlx's `Database`, in `queries`), `Admin`
//! (tenants, tokens, endpoints, plugin settings, replays), `Engine` (group commits,
//! partitions, claim at intake, notices; its doc is the backend contract) and `Housekeeping`
//! (lease recovery, purge). `StoreKind` is read off the URL once, by `config`. One
//! conformance suite, `tests/it/store.rs`, runs against both implementations.
//!
//! What the backends share is written once: `sql` (every statement both drivers run, the
//! delivery and dead-letter filters, how a delivery settles against its endpoint),
//! `queries` (every read, and on Postgres the administrative writes, generic over sqlx's
//! `Database`) and `rows` (row decoding). What differs on purpose (`SKIP LOCKED`, `UNNEST`,
//! `RETURNING`) stays in each writer: each backend keeps its own write path
//! (`sqlite/writer.rs` and `sqlite/writes.rs`, `postgres/writer.rs`), lease recovery,
//! replay re-queueing and purging; Postgres adds LISTEN/NOTIFY. The outbox relay's SQL
//! (against the producer's database) is `outbox`, with the DDL `config/outbox.sql`; the event
//! types and their numbered schema versions are `event_types`.
//!
//! What every part shares: the traits' vocabulary (the writes, what a claim hands over, the
//! filters) is `types`, how storage fails `error`, the backend a URL names `kind`. This
//! file is only the top: the modules, what they export, `Store` and [`open`].

use std::sync::Arc;

use crate::model::*;

mod admin;
pub mod audit;
pub(crate) mod committer;
mod engine;
mod error;
mod event_types;
mod kind;
pub mod outbox;
mod plugin_settings;
mod portal;
pub mod postgres;
mod queries;
mod reads;
mod rows;
mod sql;
pub mod sqlite;
mod types;

pub use admin::Admin;
pub use committer::{CommitHealth, CommitSink, Committer, Pending};
use engine::next_op_seq;
pub use engine::{Engine, Housekeeping, MEMBER_TIMEOUT, NodeIdLock};
pub use error::{BackendError, Result, StoreError};
pub use kind::{StoreKind, StoreUrlError};
pub use reads::Reads;
pub(crate) use types::stored_fingerprint;
pub use types::{
    AttemptResult, ClaimBatch, ClaimRequest, Claimed, DeliveryFilter, EndpointChange, Handoff, IngestOutcome, Notice,
    PartitionLease, Polled, QueueStats, Recorded, Release, ReplayTurn, SeriesPoint, SeriesScope, WriteOp, WriteResult,
    stored_trace,
};

/// Everything Herald stores: the union of what each kind of caller uses. Implemented by
/// every type that implements the four parts. Implementations must be safe to share
/// between tasks.
pub trait Store: Reads + Admin + Engine + Housekeeping {}

impl<T: Reads + Admin + Engine + Housekeeping + ?Sized> Store for T {}

pub type DynStore = Arc<dyn Store>;

/// Opens the store named by `url` and applies its migrations.
pub async fn open(url: &str, max_connections: u32) -> Result<DynStore> {
    Ok(match StoreKind::parse(url)? {
        StoreKind::Sqlite => Arc::new(sqlite::SqliteStore::open(url, max_connections).await?),
        StoreKind::Postgres => Arc::new(postgres::PostgresStore::open(url, max_connections).await?),
    })
}
