//! How storage fails: `StoreError`, the driver's error kept as its source, and the
//! field-first text of a unique violation that reaches API clients as it is.

use std::sync::Arc;

/// A storage failure. `Conflict` and `NotFound` are the caller's business; `Backend` is ours.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Conflict(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("storage unavailable: {0}")]
    Backend(BackendError),
    /// Refused without trying: the last write could not reach the store, and another one
    /// is finding out whether it is back (see `CommitHealth::admit`).
    #[error("storage unreachable: the last write could not reach it; nothing was tried")]
    Unreachable,
}

impl StoreError {
    /// A backend failure Herald itself detected.
    pub fn backend(message: impl Into<String>) -> StoreError {
        StoreError::Backend(BackendError { message: message.into(), source: None })
    }

    /// The database could not be reached or dropped the connection (it is restarting, the
    /// network failed, the pool found no live connection in time): the same write may
    /// succeed once it is back. Not a statement the database refused.
    pub fn is_unavailable(&self) -> bool {
        let b = match self {
            StoreError::Backend(b) => b,
            StoreError::Unreachable => return true,
            _ => return false,
        };
        let Some(e) = b.source.as_deref().and_then(|e| e.downcast_ref::<sqlx::Error>()) else { return false };
        match e {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => true,
            // Class 08: connection exceptions; 57P0x: the server is shutting down or starting.
            sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("08") || c.starts_with("57P0")),
            _ => false,
        }
    }

    /// A failure of the database driver (sqlx, rusqlite), kept as the source.
    pub(super) fn from_driver(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError::Backend(BackendError { message: e.to_string(), source: Some(Arc::new(e)) })
    }
}

/// Why the storage failed. Its text includes the driver's message, because logs print
/// only an error's text; the driver's error itself is the `source`, for callers that
/// inspect it. Shared (`Arc`) so that one failed group commit fails every caller in it.
#[derive(Debug, Clone)]
pub struct BackendError {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e
            && db.is_unique_violation()
        {
            // Postgres names the table; its constraint (`tenants_pkey`) starts with it too.
            let table = db.table().or_else(|| db.constraint().and_then(|c| c.split('_').next()));
            return StoreError::unique_violation(table, db.message());
        }
        StoreError::from_driver(e)
    }
}

impl StoreError {
    /// A unique (or primary key) violation on `table`, as a `Conflict` whose text starts with
    /// the field at fault and holds none of the driver's words: it reaches API clients as it
    /// is. The driver's text goes to the debug log.
    pub(super) fn unique_violation(table: Option<&str>, driver: &str) -> StoreError {
        tracing::debug!(table, error = driver, "unique violation");
        let message = match table {
            Some("tenants") => "id: a tenant with this id already exists",
            Some("tokens") => "id: a token with this id already exists",
            Some("endpoints") => "id: an endpoint with this id already exists",
            Some("events") => "id: an event with this id already exists",
            Some("deliveries") => "id: a delivery with this id already exists",
            Some("replays") => "id: a replay with this id already exists",
            Some("event_types" | "event") => "name: an event type with this name already exists",
            Some("plugin_settings") => "plugin: this plugin's settings already exist",
            _ => "id: an object with this id already exists",
        };
        StoreError::Conflict(message.to_string())
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
