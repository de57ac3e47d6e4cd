//! The checkpointer: a connection of its own that copies the WAL back into the database
//! file beside the writer, and the settings every rusqlite connection to the file gets.

use std::path::Path;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use rusqlite::Connection;

use super::super::*;

/// How often, at most, the WAL is copied back into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);
/// WAL size (pages) past which the writer checkpoints inline after a commit.
pub(super) const WAL_RESTART_FRAMES: i64 = 2000;

/// Starts the checkpointer: a second connection that copies the WAL back into the database
/// file (`PRAGMA wal_checkpoint(PASSIVE)`, which never blocks the writer) after commits, at
/// most every [`CHECKPOINT_EVERY`]. Left to SQLite alone, the committing connection copies
/// every 1000 pages inline, which stalled the writer 10–50 ms each time (a third of its
/// time under load). Returns the signal the writer gives after each commit; the thread
/// ends when the writer drops it.
pub(super) fn spawn_checkpointer(path: &Path) -> Result<std_mpsc::SyncSender<()>> {
    let conn = connect(path)?;
    let (dirty, rx) = std_mpsc::sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("herald-sqlite-checkpoint".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                let started = std::time::Instant::now();
                let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
                });
                match result {
                    Ok((busy, log, done)) => tracing::trace!(
                        busy,
                        wal_frames = log,
                        checkpointed = done,
                        micros = started.elapsed().as_micros() as u64,
                        "sqlite checkpoint"
                    ),
                    Err(e) => tracing::warn!(error = %e, "SQLite checkpoint failed; will try again"),
                }
                std::thread::sleep(CHECKPOINT_EVERY.saturating_sub(started.elapsed()));
            }
        })
        .map_err(|e| StoreError::backend(format!("cannot start the SQLite checkpoint thread: {e}")))?;
    Ok(dirty)
}

/// A connection to the (already migrated, already WAL) file with the store's settings.
pub(super) fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(super::BUSY_TIMEOUT)?;
    for (key, value) in super::PRAGMAS {
        conn.pragma_update(None, key, value)?;
    }
    Ok(conn)
}
