//! Which backend a store URL names, read off the URL in one place.

use super::error::StoreError;

/// Which backend a store URL names: the one place that reads it off the URL. `config`
/// parses it once and keeps it; the rest of Herald asks the kept value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// An SQLite file (`sqlite:`): one node owns it, and every lease in it.
    Sqlite,
    /// A Postgres database (`postgres:`, `postgresql:`), which several nodes may share.
    Postgres,
}

/// Why a URL names no store Herald can open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreUrlError {
    /// The scheme only: the rest of a URL may hold a password.
    #[error("unsupported store url scheme {0:?}")]
    Scheme(String),
    /// An in-memory SQLite database is not durable, and the writer's own connection would
    /// open a different database than the readers'.
    #[error("an in-memory SQLite database is not durable; name a file")]
    InMemory,
}

impl StoreKind {
    pub fn parse(url: &str) -> Result<StoreKind, StoreUrlError> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "sqlite" if url.contains(":memory:") || url.contains("mode=memory") => Err(StoreUrlError::InMemory),
            "sqlite" if url.len() > scheme.len() => Ok(StoreKind::Sqlite),
            "postgres" | "postgresql" if url.len() > scheme.len() => Ok(StoreKind::Postgres),
            _ => Err(StoreUrlError::Scheme(scheme.to_string())),
        }
    }

    /// May other nodes use the store at the same time (and change it under this one)?
    pub fn is_shared(self) -> bool {
        self == StoreKind::Postgres
    }
}

impl From<StoreUrlError> for StoreError {
    fn from(e: StoreUrlError) -> Self {
        StoreError::backend(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_kind_is_read_off_the_url_scheme() {
        let cases = [
            ("sqlite://herald.db", Ok(StoreKind::Sqlite)),
            ("sqlite:herald.db?mode=rwc", Ok(StoreKind::Sqlite)),
            ("postgres://u:p@127.0.0.1/db", Ok(StoreKind::Postgres)),
            ("postgresql://127.0.0.1/db", Ok(StoreKind::Postgres)),
            ("sqlite::memory:", Err(StoreUrlError::InMemory)),
            ("sqlite://x.db?mode=memory", Err(StoreUrlError::InMemory)),
            ("mysql://u:secret@host/db", Err(StoreUrlError::Scheme("mysql".into()))),
            ("sqlite", Err(StoreUrlError::Scheme("sqlite".into()))),
            ("", Err(StoreUrlError::Scheme("".into()))),
        ];
        for (url, kind) in cases {
            assert_eq!(StoreKind::parse(url), kind, "{url}");
        }
        assert!(StoreKind::Postgres.is_shared() && !StoreKind::Sqlite.is_shared());
    }
}
