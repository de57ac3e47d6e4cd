//! What orders plugin writes against the endpoints that bind them: the per-tenant
//! [`PluginLocks`], and the endpoints that bind a plugin (by name or pinned).
//!
//! Bindings are in the store, plugins in the node's directory, and no transaction spans
//! both: the lock (this node only) orders endpoint writes that bind a plugin with that
//! plugin's `DELETE` and upload. Which endpoints bind or pin a plugin is
//! `model::PluginBindings::{binds, pinned}`.

use std::sync::Arc;

pub(super) use super::reach::binding;
use super::{ApiError, AppState};
use crate::model::TenantId;

/// The versions of `name` that `tenant`'s endpoints pin (`name@n`): an upload keeps them.
/// Read under the tenant's binding lock.
pub(super) async fn pinned_versions(state: &AppState, tenant: &TenantId, name: &str) -> Result<Vec<u32>, ApiError> {
    let endpoints = binding(state, tenant, name).await?;
    Ok(endpoints.iter().flat_map(|e| e.spec.plugins.pinned(name).collect::<Vec<_>>()).collect())
}

/// One lock per tenant around what must not interleave with a plugin's bindings: an
/// endpoint write that binds a plugin (from validating the binding to the store write),
/// a plugin `DELETE` (from the check that nothing binds it to the delete) and an upload
/// (from reading the pinned versions to pruning). Bindings are in the store and plugins in
/// the node's directory, with no transaction spanning both, so this is what keeps an
/// endpoint from being bound to a plugin deleted under it.
///
/// It holds on this node only. Across nodes nothing orders a delete on one with a binding
/// on another: each node serves the plugins of its own directory, so an operator running
/// several nodes deletes a plugin (and uploads it) through each, after unbinding it.
#[derive(Default)]
pub struct PluginLocks {
    tenants: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl PluginLocks {
    /// Waits for `tenant`'s lock (one tenant's wait never holds another's up).
    pub(crate) async fn lock(&self, tenant: &TenantId) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(tenants.entry(tenant.as_str().to_string()).or_default())
        };
        lock.lock_owned().await
    }
}
