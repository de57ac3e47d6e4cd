//! The Postgres server's CPU in a run: the node's backends (the connections of the run's
//! schema, by application name) and the server's own writers (WAL writer, checkpointer,
//! background writer, autovacuum), read from `/proc` before and after. The writers serve
//! every database of the server, so on a shared server they count others' work too.

use std::collections::HashMap;
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tests::pg::PgSchema;

use super::{clock_ticks, stat_cpu_seconds};

/// CPU seconds per process at the start of a run.
pub struct PgCpu {
    conn: PgConnection,
    app: String,
    before: HashMap<u32, f64>,
}

/// The server's processes that write for every backend.
const WRITERS: [&str; 4] = ["walwriter", "checkpointer", "background writer", "autovacuum"];

impl PgCpu {
    pub async fn start(schema: &PgSchema) -> anyhow::Result<PgCpu> {
        let conn = PgConnectOptions::from_str(&schema.url)?.application_name("herald-bench").connect().await?;
        let mut cpu = PgCpu { conn, app: schema.name.clone(), before: HashMap::new() };
        cpu.before = cpu.sample().await?;
        Ok(cpu)
    }

    /// (backends, writers) CPU seconds since the start. A backend that ended in between
    /// counts for nothing (the node's pool keeps its connections through a run).
    pub async fn stop(mut self) -> anyhow::Result<(f64, f64)> {
        let backends = self.backends().await?;
        let after = self.sample().await?;
        let (mut ours, mut writers) = (0.0, 0.0);
        for (pid, cpu) in &after {
            let spent = cpu - self.before.get(pid).copied().unwrap_or(0.0);
            match backends.contains(pid) {
                true => ours += spent,
                false => writers += spent,
            }
        }
        let _ = self.conn.close().await;
        Ok((ours, writers))
    }

    async fn backends(&mut self) -> anyhow::Result<Vec<u32>> {
        let pids: Vec<i32> = sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
            .bind(&self.app)
            .fetch_all(&mut self.conn)
            .await?;
        Ok(pids.into_iter().map(|p| p as u32).collect())
    }

    /// CPU seconds of the node's backends and the server's writers.
    async fn sample(&mut self) -> anyhow::Result<HashMap<u32, f64>> {
        let ticks = clock_ticks()?;
        let mut out = HashMap::new();
        for pid in self.backends().await? {
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                out.insert(pid, stat_cpu_seconds(&stat, ticks)?);
            }
        }
        for entry in std::fs::read_dir("/proc")? {
            let Some(pid) = entry?.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(cmdline) = std::fs::read_to_string(format!("/proc/{pid}/cmdline")) else { continue };
            if !cmdline.starts_with("postgres: ") || !WRITERS.iter().any(|w| cmdline.contains(w)) {
                continue;
            }
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                out.insert(pid, stat_cpu_seconds(&stat, ticks)?);
            }
        }
        Ok(out)
    }
}
