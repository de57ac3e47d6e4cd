//! What every request handler shares: the node's store, committer, engine, plugin host
//! and catalog, and the API's own caches (tenant tokens on a single node, tenants).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use super::bindings;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::{TenantId, TokenRecord};
use crate::store::{Committer, DynStore};

/// Shared state of every request handler.
pub struct AppState {
    pub config: Arc<Config>,
    /// The engine's clock: stored times the API writes are on the engine's time.
    pub clock: crate::clock::Clock,
    pub store: DynStore,
    pub committer: Committer,
    pub metrics: Arc<Metrics>,
    /// The delivery engine, told of committed new work (`poke`) and of committed endpoint
    /// changes (`changed`: this node's partitions and, through the store, the others').
    pub engine: crate::intake::Waker,
    pub replayer: crate::replay::Replayer,
    pub plugins: crate::plugin::PluginHost,
    /// The event catalog intake checks events against (refreshed after every write of it).
    pub catalog: Arc<crate::catalog::Catalog>,
    /// The outbox relays' status (for `/readyz`); empty without `[[outbox]]` sources.
    pub outbox: crate::outbox::Relays,
    /// The engine's client, for what this node knows of endpoints' OAuth2 tokens.
    pub deliverer: Option<crate::deliver::Deliverer>,
    /// Tenant tokens by hash, and when each one's last use was written. `None` on a shared
    /// store: see `auth::caller`.
    pub(crate) tokens: Option<RwLock<HashMap<String, TokenRecord>>>,
    pub(crate) token_use: std::sync::Mutex<HashMap<String, crate::model::Millis>>,
    pub(crate) tenants: RwLock<HashSet<TenantId>>,
    /// Orders plugin deletes and uploads with endpoint writes that bind plugins.
    pub(crate) plugin_locks: bindings::PluginLocks,
    /// Intake spans, when exported.
    pub telemetry: crate::telemetry::Telemetry,
    /// This node's id (`cluster.node_id`): a `listen` endpoint whose listener connects here
    /// is pinned to it.
    pub node_id: String,
}

impl AppState {
    pub fn new(
        config: Arc<Config>,
        store: DynStore,
        committer: Committer,
        metrics: Arc<Metrics>,
        engine: crate::intake::Waker,
        replayer: crate::replay::Replayer,
        plugins: crate::plugin::PluginHost,
    ) -> Arc<AppState> {
        let tokens = (!config.store_kind.is_shared()).then(RwLock::default);
        Arc::new(AppState {
            config,
            clock: engine.clock(),
            catalog: Arc::new(crate::catalog::Catalog::new(metrics.clone())),
            store,
            committer,
            metrics,
            engine,
            replayer,
            plugins,
            outbox: Default::default(),
            deliverer: None,
            tokens,
            token_use: Default::default(),
            tenants: RwLock::default(),
            plugin_locks: Default::default(),
            telemetry: Default::default(),
            node_id: String::new(),
        })
    }

    /// The state with this node's id (before it is shared).
    pub fn with_node_id(mut self: Arc<Self>, node_id: String) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.node_id = node_id;
        }
        self
    }

    /// The state with the engine's client (before it is shared).
    pub fn with_deliverer(mut self: Arc<Self>, deliverer: crate::deliver::Deliverer) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.deliverer = Some(deliverer);
        }
        self
    }

    /// The state with the node's span export (before it is shared).
    pub fn with_telemetry(mut self: Arc<Self>, telemetry: crate::telemetry::Telemetry) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.telemetry = telemetry;
        }
        self
    }

    /// The state with the node's event catalog (before it is shared).
    pub fn with_catalog(mut self: Arc<Self>, catalog: Arc<crate::catalog::Catalog>) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.catalog = catalog;
        }
        self
    }

    /// The state with the outbox relays' status (before it is shared).
    pub fn with_outbox(mut self: Arc<Self>, relays: crate::outbox::Relays) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.outbox = relays;
        }
        self
    }
}
