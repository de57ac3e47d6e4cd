//! Postgres for tests: every test gets a fresh schema in the database named by
//! `HERALD_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`), and a
//! store URL that points at it. A Postgres that cannot be reached fails the test; it is
//! never skipped.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Executor};

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The database the Postgres tests use.
pub fn base_url() -> String {
    std::env::var("HERALD_TEST_POSTGRES_URL").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| DEFAULT_URL.into())
}

/// A schema of its own for one test, dropped (with everything in it) when this is dropped.
pub struct PgSchema {
    pub name: String,
    /// A store URL whose connections use this schema (`options=-c search_path=…`).
    pub url: String,
    base: String,
}

impl PgSchema {
    /// A schema in the test database (`base_url()`).
    pub async fn create() -> anyhow::Result<PgSchema> {
        PgSchema::create_in(&base_url()).await
    }

    /// A schema in the database at `base`.
    pub async fn create_in(base: &str) -> anyhow::Result<PgSchema> {
        let base = base.to_string();
        let mut conn = connect(&base).await?;
        let name = format!("herald_t_{:016x}", rand::random::<u64>());
        conn.execute(format!("CREATE SCHEMA {name}").as_str()).await?;
        let _ = conn.close().await;
        let sep = if base.contains('?') { '&' } else { '?' };
        // The application name marks the schema's connections, so the drop can end them.
        let url = format!("{base}{sep}application_name={name}&options=-c%20search_path%3D{name}");
        Ok(PgSchema { name, url, base })
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        // Drop may run inside a runtime: clean up on a thread with its own.
        let (base, name) = (self.base.clone(), self.name.clone());
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                let mut conn = connect(&base).await?;
                // A node of the test may still hold a transaction open (its runtime may be the
                // one this drop blocks): end its connections first, and never wait forever.
                conn.execute(
                    format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'")
                        .as_str(),
                )
                .await?;
                conn.execute("SET lock_timeout = '10s'").await?;
                conn.execute(format!("DROP SCHEMA IF EXISTS {name} CASCADE").as_str()).await?;
                anyhow::Ok(())
            })
        });
        if let Ok(Err(e)) = cleanup.join() {
            eprintln!("could not drop test schema {}: {e:#}", self.name);
        }
    }
}

/// Connects to `url`, creating its database first if the server does not have it yet.
async fn connect(url: &str) -> anyhow::Result<PgConnection> {
    let unreachable =
        || format!("cannot reach Postgres at {url} (set HERALD_TEST_POSTGRES_URL; scripts/test starts one)");
    let options = PgConnectOptions::from_str(url).with_context(unreachable)?;
    match timeout(options.connect()).await.with_context(unreachable)? {
        Ok(c) => Ok(c),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
            let db = options.get_database().unwrap_or("test").to_string();
            let mut admin = timeout(options.clone().database("postgres").connect()).await?.with_context(unreachable)?;
            // Several test processes may race to create it.
            if let Err(e) = admin.execute(format!("CREATE DATABASE \"{db}\"").as_str()).await
                && !matches!(&e, sqlx::Error::Database(d) if d.code().as_deref() == Some("42P04"))
            {
                return Err(e).with_context(unreachable);
            }
            timeout(options.connect()).await?.with_context(unreachable)
        }
        Err(e) => Err(e).with_context(unreachable),
    }
}

async fn timeout<T>(f: impl Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_secs(10), f).await.context("timed out connecting to Postgres")
}

/// A Postgres server of a test's own, for tests that stop and start it (never the shared
/// one other tests use): `initdb` into a temporary directory, on a free loopback port,
/// driven with `pg_ctl`. As root (the tests' machine), those run as the `postgres` user.
/// Dropping it stops the server at once (`-m immediate`), whatever the test did.
pub struct OwnPostgres {
    pub port: u16,
    data: std::path::PathBuf,
    dir: tempfile::TempDir,
    /// Each commit waits for its WAL to reach the disk, as in production (tests turn it
    /// off: they measure behaviour, not speed).
    durable: bool,
}

/// Where the server binaries live (`HERALD_TEST_PG_BIN`, default Debian's Postgres 15).
fn pg_bin(tool: &str) -> std::path::PathBuf {
    let dir = std::env::var("HERALD_TEST_PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    std::path::Path::new(&dir).join(tool)
}

impl OwnPostgres {
    /// Creates the cluster and starts the server, without `fsync`.
    pub fn start() -> anyhow::Result<OwnPostgres> {
        Self::create(false)
    }

    /// As [`OwnPostgres::start`], with every commit flushed to the disk (for benchmarks).
    pub fn start_durable() -> anyhow::Result<OwnPostgres> {
        Self::create(true)
    }

    fn create(durable: bool) -> anyhow::Result<OwnPostgres> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let data = dir.path().join("data");
        if is_root() {
            let owner = |flag: &str| -> anyhow::Result<u32> {
                let out = std::process::Command::new("id").args([flag, "postgres"]).output()?;
                Ok(String::from_utf8(out.stdout)?.trim().parse()?)
            };
            std::os::unix::fs::chown(dir.path(), Some(owner("-u")?), Some(owner("-g")?))?;
        }
        let data_arg = data.display().to_string();
        run_as_postgres(&pg_bin("initdb"), &["-D", &data_arg, "-U", "postgres", "--auth=trust", "-N"])?;
        let pg = OwnPostgres { port, data, dir, durable };
        pg.start_again()?;
        Ok(pg)
    }

    /// A store URL on the server's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the (stopped) server and waits until it accepts connections.
    pub fn start_again(&self) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync={} -c max_connections=200",
            self.port,
            self.dir.path().display(),
            if self.durable { "on" } else { "off" }
        );
        // Benchmarks count the statements each delivery costs.
        let options = match self.durable {
            true => options + " -c shared_preload_libraries=pg_stat_statements",
            false => options,
        };
        let log = self.dir.path().join("server.log").display().to_string();
        self.pg_ctl(&["start", "-w", "-t", "30", "-o", &options, "-l", &log])
    }

    /// The server's main process (every backend is its child).
    pub fn postmaster_pid(&self) -> anyhow::Result<u32> {
        let file = std::fs::read_to_string(self.data.join("postmaster.pid"))?;
        Ok(file.lines().next().context("postmaster.pid")?.trim().parse()?)
    }

    /// Stops the server (`mode`: `fast` ends every session and stops cleanly, `immediate`
    /// as if the machine lost power) and waits until it is down.
    pub fn stop(&self, mode: &str) -> anyhow::Result<()> {
        self.pg_ctl(&["stop", "-w", "-t", "30", "-m", mode])
    }

    fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let data = self.data.display().to_string();
        let mut all = vec!["-D", data.as_str()];
        all.extend_from_slice(args);
        run_as_postgres(&pg_bin("pg_ctl"), &all)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        // Already stopped: pg_ctl says so and nothing happens.
        let _ = self.stop("immediate");
    }
}

#[allow(unsafe_code)]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a server tool, as `postgres` when this is root (Postgres refuses to run as root).
fn run_as_postgres(tool: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = if is_root() {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(tool);
        c
    } else {
        std::process::Command::new(tool)
    };
    let out =
        cmd.args(args).stdin(std::process::Stdio::null()).output().with_context(|| format!("{}", tool.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} {args:?}: {}{}",
        tool.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
