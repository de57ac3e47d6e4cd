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

/// Creates a missing WAL (`path`) as `WAL_RESTART_FRAMES` frames of zeros, on disk, before any
/// connection opens it. SQLite reads a WAL whose header is not valid as empty and writes
/// its frames from the start, so nothing changes but this: the commits that fill a fresh
/// WAL no longer grow the file, and their `fdatasync` no longer writes the inode too
/// (measured: 60 inode writes, 52 ms of the writer's waiting, in a fresh node's first 1.5 s
/// under load). The file then keeps its size: the WAL restarts from its start and is never
/// truncated. A WAL that exists is left alone: it may hold commits not yet checkpointed.
pub(super) fn preallocate_wal(path: &Path) -> Result<()> {
    let mut open = super::private_file();
    open.create_new(true);
    let failed = |e: std::io::Error| StoreError::backend(format!("cannot prepare {}: {e}", path.display()));
    let mut file = match open.open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(failed(e)),
    };
    let zeros = vec![0u8; 1 << 20];
    let mut left = WAL_HEADER + WAL_RESTART_FRAMES as u64 * (PAGE_SIZE + WAL_FRAME_HEADER);
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        std::io::Write::write_all(&mut file, &zeros[..n]).map_err(failed)?;
        left -= n as u64;
    }
    file.sync_all().map_err(failed)
}

/// The WAL's layout (SQLite's file format): a 32-byte header, then frames of a 24-byte
/// header and a page (4 KiB, SQLite's default page size, which Herald keeps).
const WAL_HEADER: u64 = 32;
const WAL_FRAME_HEADER: u64 = 24;
const PAGE_SIZE: u64 = 4096;

/// A connection to the (already migrated, already WAL) file with the store's settings.
pub(super) fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(super::BUSY_TIMEOUT)?;
    for (key, value) in super::PRAGMAS {
        conn.pragma_update(None, key, value)?;
    }
    Ok(conn)
}
