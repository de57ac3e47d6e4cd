//! Wires config, store, committer, delivery engine and API into a running node, and runs it
//! until the shutdown future resolves (shutdown is passed in, never global).
//!
//! On shutdown the API stops accepting, then the engine drains (attempts in flight record
//! their results, partitions hand unsent claims back) within a grace period. It applies
//! tenants' own plugin settings (`plugin_settings` in the store, written through
//! `api/plugin_config.rs`) to the plugin host at start and, on a shared Postgres, follows
//! other nodes' changes and the catalog's once a second (the host merges the settings
//! between the operator's TOML defaults and overrides and re-derives the serving version, no
//! compile). `reserve_fd_table`: before the runtime's threads start, `herald serve` sizes
//! the process's descriptor table for the connections its settings allow (grown on demand,
//! each doubling stalls every thread for an RCU grace period).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::catalog::Catalog;
use crate::ops::{self, Ops};
use crate::outbox;
use crate::plugin::PluginHost;
use crate::replay::Replayer;
use crate::worker::Engine;

use crate::api::{AppState, router};
use crate::config::{Config, ServerLimits};
use crate::metrics::Metrics;
use crate::store::{self, Committer, DynStore, StoreError};
use crate::telemetry::Telemetry;

/// Why a node could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    #[error("plugins: {0}")]
    Plugins(#[from] crate::plugin::PluginError),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    #[error("cluster.node_id {0:?} is held by another live process on this store; give each node its own id")]
    NodeIdTaken(String),
}

/// Connections `server.admin_listen` serves at once: probes and scrapers need few.
const ADMIN_MAX_CONNECTIONS: usize = 16;

/// How long a stopping node waits for in-flight attempts: the default request deadline
/// plus room to record the results.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// Grows this process's file-descriptor table now, to `slots` descriptors (at most the
/// soft `RLIMIT_NOFILE`), instead of while connections pour in. Linux doubles the table on
/// demand, and in a multi-threaded process each growth waits for an RCU grace period while
/// every other thread that opens a descriptor waits for it: measured on a 2-core VM, both
/// runtime threads stalled 18 ms at a time, three times over, as a fresh node's first
/// fan-out passed 64, 128 and 256 connections. Call it before any thread starts: a
/// single-threaded process grows its table without waiting. The table never shrinks; 4096
/// slots cost 33 KiB.
pub fn reserve_fd_table(slots: usize) {
    #[cfg(unix)]
    {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
        let top = (slots as u64).min(limit.saturating_sub(1)).min(i32::MAX as u64) as i32;
        let reserve = std::fs::File::open("/dev/null")
            .and_then(|null| Ok(rustix::io::fcntl_dupfd_cloexec(&null, top.max(1) - 1)?));
        // The duplicate, numbered `top - 1` or above, is closed at once: its slot stays.
        if let Err(e) = reserve {
            tracing::debug!(slots = top, error = %e, "cannot grow the file-descriptor table ahead of need");
        }
    }
    #[cfg(not(unix))]
    let _ = slots;
}

/// Runs a node on `listener` until `shutdown` resolves, then drains its engine.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    let config = Arc::new(config);
    let store = store::open(&config.store_url, config.store_max_connections).await?;
    let metrics = Arc::new(Metrics::default());
    let committer = Committer::start(store.clone(), config.intake_max_batch).reporting_to(metrics.store_health.clone());
    let (stop, stopped) = watch::channel(false);
    let (node_id, node_lock) = hold_node_id(&config, &store).await?;
    let ops = Ops::setup(&store, committer.clone(), metrics.clone(), &config.operator, config.retry.ttl()).await?;
    let plugins = start_plugins(&config).await?;
    let telemetry = match &config.tracing {
        Some(t) => Telemetry::start(t, tokio::runtime::Handle::current())?,
        None => Telemetry::off(),
    };
    apply_plugin_settings(&store, &plugins).await?;
    // Several nodes may share a Postgres store: each follows what the others change.
    let shared = config.store_kind.is_shared();
    if shared {
        tokio::spawn(follow_plugin_settings(store.clone(), plugins.clone(), stopped.clone()));
    }
    let catalog = Arc::new(Catalog::new(metrics.clone()));
    catalog.refresh(&store).await?;
    if shared {
        tokio::spawn(follow_catalog(store.clone(), catalog.clone(), stopped.clone()));
    }
    let engine = Engine::start(
        node_id.clone(),
        store.clone(),
        committer.clone(),
        config.clone(),
        metrics.clone(),
        ops.clone(),
        plugins.clone(),
        telemetry.clone(),
        catalog.clone(),
        stopped.clone(),
    )
    .await;
    let waker: crate::intake::Waker = Arc::new(engine.clone());
    ops.attach(&waker);
    let replayer = Replayer::start(store.clone(), waker.clone(), config.retry.ttl(), shared, stopped.clone()).await;
    // A relay for each `[[outbox]]` source, feeding the same intake as the API.
    let outbox_node = outbox::Node {
        store: store.clone(),
        committer: committer.clone(),
        metrics: metrics.clone(),
        engine: waker.clone(),
        ops: ops.clone(),
        limits: crate::intake::IntakeLimits::from_config(&config),
        telemetry: telemetry.clone(),
        catalog: catalog.clone(),
    };
    let relays = outbox::start(&config.outbox, outbox_node, stopped.clone())?;
    ops::start_housekeeping(store.clone(), ops, config.operator.clone(), config.retention.clone(), stopped);
    let state = AppState::new(config.clone(), store, committer, metrics, waker, replayer, plugins)
        .with_outbox(relays)
        .with_deliverer(engine.deliverer())
        .with_node_id(node_id.clone())
        .with_telemetry(telemetry.clone())
        .with_catalog(catalog);
    let admin = match config.admin_listen {
        Some(addr) => Some(TcpListener::bind(addr).await?),
        None => None,
    };
    tracing::info!(listen = %listener.local_addr()?, store = %config.store_url, node_id, "herald serving");
    if let Some(admin) = admin {
        tracing::info!(admin_listen = %admin.local_addr()?, "serving /healthz, /readyz and /metrics");
        let limits = ServerLimits { max_connections: ADMIN_MAX_CONNECTIONS, ..config.server };
        let mut stopping = stop.subscribe();
        let stopped = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        tokio::spawn(crate::api::listen::serve(admin, crate::api::admin_router(state.clone()), limits, stopped));
    }
    // A node id lost to another process stops this one: its leases are the other's now.
    let mut lost = node_lock.lost.clone();
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            Ok(_) = lost.wait_for(|l| *l) => {}
        }
        let _ = stop.send(true);
    };
    crate::api::listen::serve(listener, router(state), config.server, shutdown).await?;
    // In-flight attempts record their results, and partitions hand unsent claims back,
    // before the node exits; it gives its partition leases up only if its id is still its own.
    let still_ours = !*node_lock.lost.borrow();
    engine.drain(SHUTDOWN_GRACE, still_ours).await;
    if !still_ours {
        return Err(AppError::NodeIdTaken(node_id));
    }
    drop(node_lock);
    // What is batched goes to the collector before the process ends.
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await.ok();
    Ok(())
}

/// How long a start waits for the id it asks for to come free: a killed process's database
/// session ends (and frees the id) a moment after the process.
const NODE_ID_WAIT: Duration = Duration::from_secs(3);
/// How long a start waits for the host name's id before it tries `<host>-2`, and so on.
const HOST_ID_WAIT: Duration = Duration::from_secs(1);
/// How many host-name ids a start tries.
const HOST_ID_SLOTS: usize = 16;

/// Holds this node's id (see `store::Engine::hold_node_id`) for the process's life, so a
/// restarted node takes up its own leases at once: `cluster.node_id` as set (refused while
/// another live process holds it), else the host name, or `<host>-2`, `<host>-3`, … when
/// other processes on the host hold those (a restart then usually finds its own again).
async fn hold_node_id(config: &Config, store: &DynStore) -> Result<(String, store::NodeIdLock), AppError> {
    let candidates: Vec<(String, Duration)> = match &config.node_id {
        Some(id) => vec![(id.clone(), NODE_ID_WAIT)],
        None => {
            let host = host_name();
            let others = (2..=HOST_ID_SLOTS).map(|n| (format!("{host}-{n}"), Duration::ZERO));
            std::iter::once((host.clone(), HOST_ID_WAIT)).chain(others).collect()
        }
    };
    for (id, wait) in &candidates {
        let deadline = tokio::time::Instant::now() + *wait;
        loop {
            if let Some(lock) = store.hold_node_id(id).await? {
                return Ok((id.clone(), lock));
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Err(AppError::NodeIdTaken(candidates[0].0.clone()))
}

/// This machine's host name as a node id (`cluster.node_id`'s characters), or `herald`.
pub fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
        .take(crate::config::MAX_NODE_ID - 4)
        .collect();
    if name.is_empty() { "herald".into() } else { name }
}

/// Starts the plugin host: it loads every tenant's plugins in the background (serving
/// does not wait for them) and watches the directory.
async fn start_plugins(config: &Config) -> Result<PluginHost, AppError> {
    let pc = config.plugins.clone();
    let host = tokio::task::spawn_blocking(move || PluginHost::start(pc))
        .await
        .map_err(|e| AppError::Io(std::io::Error::other(e)))??;
    Ok(host)
}

/// Applies every tenant's stored plugin settings to the host (unchanged ones cost nothing).
async fn apply_plugin_settings(store: &DynStore, plugins: &PluginHost) -> Result<(), StoreError> {
    for s in store.all_plugin_settings().await? {
        plugins.set_tenant_config(s.tenant.as_str(), &s.plugin, s.settings.merged());
    }
    Ok(())
}

/// On a shared store, follows other nodes' catalog writes within [`SETTINGS_FOLLOW`]: one
/// read of `catalog_revision` per interval, and a reload of the catalog only when it moved
/// (schemas of a (type, version) already compiled are kept). A poll rather than a NOTIFY:
/// a catalog changes rarely, a missed notification would leave a node validating against
/// an old schema until restart, and a one-row read a second costs nothing.
async fn follow_catalog(store: DynStore, catalog: Arc<Catalog>, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SETTINGS_FOLLOW) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        if let Err(e) = catalog.refresh(&store).await {
            tracing::warn!(error = %e, "cannot read the event catalog; will retry");
        }
    }
}

/// How soon a node sharing a Postgres store applies a plugin setting another node took.
const SETTINGS_FOLLOW: Duration = Duration::from_secs(1);

/// On a shared store, applies other nodes' plugin-setting changes within
/// [`SETTINGS_FOLLOW`] (one small read per interval) until the node stops.
async fn follow_plugin_settings(store: DynStore, plugins: PluginHost, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SETTINGS_FOLLOW) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        if let Err(e) = apply_plugin_settings(&store, &plugins).await {
            tracing::warn!(error = %e, "cannot read plugin settings; will retry");
        }
    }
}
