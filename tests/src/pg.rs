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
