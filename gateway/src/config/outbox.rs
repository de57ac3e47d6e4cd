//! `[[outbox]]`: transactional outbox sources, each a table in a producer's Postgres
//! database that Herald relays into its own intake (see `crate::outbox`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, StoreUrl, duration, invalid};
use crate::model::TenantId;

/// One `[[outbox]]` source as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawOutbox {
    pub name: String,
    pub url: String,
    pub table: String,
    pub tenant: String,
    pub tenant_map: BTreeMap<String, String>,
    pub batch: u32,
    pub poll_interval: String,
    pub max_connections: u32,
}

impl Default for RawOutbox {
    fn default() -> Self {
        Self {
            name: String::new(),
            url: String::new(),
            table: crate::store::outbox::DEFAULT_TABLE.into(),
            tenant: String::new(),
            tenant_map: BTreeMap::new(),
            batch: 500,
            poll_interval: "1s".into(),
            max_connections: 2,
        }
    }
}

/// A validated outbox source.
#[derive(Debug, Clone)]
pub struct OutboxSource {
    /// Names the source in metrics, `/readyz` and logs (default: the table's name).
    pub name: String,
    /// The producer's database (printed without its password).
    pub url: StoreUrl,
    /// An unqualified identifier; the schema is the URL's `search_path`.
    pub table: String,
    /// The tenant of rows whose `tenant` is NULL (`None`: such rows are parked).
    pub tenant: Option<TenantId>,
    /// Producer tenant values → Herald tenants; an unlisted value is taken as written.
    pub tenant_map: BTreeMap<String, TenantId>,
    /// Rows taken per producer transaction (and at most this many re-read after a crash).
    pub batch: u32,
    /// How often the relay looks without a NOTIFY.
    pub poll_interval: Duration,
    pub max_connections: u32,
}

/// The largest batch: one intake commit of this many events stays well under a second.
pub const MAX_OUTBOX_BATCH: u32 = 10_000;

/// Validates every source; names must be unique.
pub fn validate(raw: &[RawOutbox]) -> Result<Vec<OutboxSource>, ConfigError> {
    let mut sources: Vec<OutboxSource> = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let source = r.validate(&format!("outbox[{i}]"))?;
        if sources.iter().any(|s| s.name == source.name) {
            return Err(invalid(&format!("outbox[{i}].name"), format!("{:?} names two sources", source.name)));
        }
        sources.push(source);
    }
    Ok(sources)
}

impl RawOutbox {
    fn validate(&self, at: &str) -> Result<OutboxSource, ConfigError> {
        let key = |k: &str| format!("{at}.{k}");
        if !(self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")) {
            return Err(invalid(&key("url"), "must be a postgres:// URL (the producer's database)"));
        }
        if !is_identifier(&self.table) {
            return Err(invalid(
                &key("table"),
                format!(
                    "{:?} must be 1-48 chars of a-z, 0-9 or '_', starting with a letter or '_' (choose the schema with the URL's search_path)",
                    self.table
                ),
            ));
        }
        let name = if self.name.is_empty() { self.table.clone() } else { self.name.clone() };
        if name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return Err(invalid(&key("name"), format!("{name:?} must be 1-64 chars of a-z, A-Z, 0-9, '_' or '-'")));
        }
        let tenant = (!self.tenant.is_empty()).then(|| tenant_id(&key("tenant"), &self.tenant)).transpose()?;
        let tenant_map = self
            .tenant_map
            .iter()
            .map(|(from, to)| Ok((from.clone(), tenant_id(&key(&format!("tenant_map.{from}")), to)?)))
            .collect::<Result<_, ConfigError>>()?;
        if self.batch == 0 || self.batch > MAX_OUTBOX_BATCH {
            return Err(invalid(&key("batch"), format!("must be 1 to {MAX_OUTBOX_BATCH}")));
        }
        let poll_interval = duration(&key("poll_interval"), &self.poll_interval)?;
        if poll_interval < Duration::from_millis(10) {
            return Err(invalid(&key("poll_interval"), "must be at least 10ms"));
        }
        if self.max_connections < 2 {
            return Err(invalid(&key("max_connections"), "must be at least 2 (one relays, one listens)"));
        }
        Ok(OutboxSource {
            name,
            url: StoreUrl::new(self.url.clone()),
            table: self.table.clone(),
            tenant,
            tenant_map,
            batch: self.batch,
            poll_interval,
            max_connections: self.max_connections,
        })
    }
}

/// A Herald tenant id a source may ingest into: valid, and not the reserved one.
fn tenant_id(key: &str, value: &str) -> Result<TenantId, ConfigError> {
    let id = TenantId::parse(value).map_err(|e| invalid(key, e.0))?;
    if id.as_str() == crate::model::OPS_TENANT {
        return Err(invalid(key, format!("{value:?} is Herald's own tenant for operational events")));
    }
    Ok(id)
}

/// An unqualified SQL identifier that needs no quoting (it is written into statements).
pub fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 48
        && s.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    type Edit = Box<dyn FnOnce(&mut RawOutbox)>;

    fn source(edit: impl FnOnce(&mut RawOutbox)) -> Result<Vec<OutboxSource>, ConfigError> {
        let mut raw = RawOutbox { url: "postgres://app@127.0.0.1/shop".into(), ..RawOutbox::default() };
        edit(&mut raw);
        validate(&[raw])
    }

    #[test]
    fn a_minimal_source_takes_the_defaults() {
        let s = source(|_| {}).unwrap().remove(0);
        assert_eq!((s.name.as_str(), s.table.as_str(), s.batch), ("herald_outbox", "herald_outbox", 500));
        assert_eq!(s.poll_interval, Duration::from_secs(1));
        assert!(s.tenant.is_none());
    }

    #[test]
    fn bad_sources_name_the_key() {
        #[rustfmt::skip]
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|r| r.url = "sqlite://x.db".into()),                       "outbox[0].url"),
            (Box::new(|r| r.table = "public.outbox".into()),                     "outbox[0].table"),
            (Box::new(|r| r.table = "Outbox; DROP".into()),                      "outbox[0].table"),
            (Box::new(|r| r.name = "a b".into()),                                "outbox[0].name"),
            (Box::new(|r| r.tenant = "Acme".into()),                             "outbox[0].tenant"),
            (Box::new(|r| r.tenant = "herald-ops".into()),                       "outbox[0].tenant"),
            (Box::new(|r| { r.tenant_map.insert("x".into(), "A!".into()); }),    "outbox[0].tenant_map.x"),
            (Box::new(|r| r.batch = 0),                                          "outbox[0].batch"),
            (Box::new(|r| r.batch = MAX_OUTBOX_BATCH + 1),                       "outbox[0].batch"),
            (Box::new(|r| r.poll_interval = "1ms".into()),                       "outbox[0].poll_interval"),
            (Box::new(|r| r.poll_interval = "soon".into()),                      "outbox[0].poll_interval"),
            (Box::new(|r| r.max_connections = 1),                                "outbox[0].max_connections"),
        ];
        for (edit, want) in cases {
            match source(edit) {
                Err(ConfigError::Invalid { key, .. }) => assert_eq!(key, want),
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    #[test]
    fn two_sources_cannot_share_a_name() {
        let raw = RawOutbox { url: "postgres://a@h/db".into(), ..RawOutbox::default() };
        let err = validate(&[raw.clone(), raw]).unwrap_err();
        assert!(err.to_string().contains("outbox[1].name"), "{err}");
    }
}
