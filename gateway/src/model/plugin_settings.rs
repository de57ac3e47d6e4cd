//! A tenant's own configuration of one of its plugins: what `PUT …/plugins/{name}/config`
//! stores and the plugin reads with `get-config`. Secret values are stored like the
//! others but never shown again through the API.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Most keys one plugin's settings may hold (values and secrets together).
pub const MAX_SETTINGS: usize = 64;
/// Longest key, in bytes.
pub const MAX_SETTING_KEY: usize = 128;
/// Longest value, in bytes.
pub const MAX_SETTING_VALUE: usize = 4096;

/// Plain values and secret (write-only) values, with disjoint keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginSettings {
    pub values: BTreeMap<String, String>,
    pub secrets: BTreeMap<String, String>,
}

/// One plugin's settings as stored, with their owner and when they last changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPluginSettings {
    pub tenant: super::TenantId,
    pub plugin: String,
    pub settings: PluginSettings,
    pub updated_at: super::Millis,
}

impl PluginSettings {
    /// Checks the limits; the message starts with the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.values.len() + self.secrets.len() > MAX_SETTINGS {
            return Err(format!("values: at most {MAX_SETTINGS} keys (values and secrets together)"));
        }
        for (field, map) in [("values", &self.values), ("secrets", &self.secrets)] {
            for (k, v) in map {
                check_key(field, k)?;
                if v.len() > MAX_SETTING_VALUE || v.contains('\0') {
                    return Err(format!("{field}.{k}: at most {MAX_SETTING_VALUE} bytes, no NUL"));
                }
            }
        }
        if let Some(k) = self.values.keys().find(|k| self.secrets.contains_key(*k)) {
            return Err(format!("secrets.{k}: a key is either a value or a secret, not both"));
        }
        Ok(())
    }

    /// Values and secrets as the one map a plugin reads.
    pub fn merged(&self) -> HashMap<String, String> {
        self.values.iter().chain(&self.secrets).map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// Keys are 1–128 bytes of `[A-Za-z0-9._-]`, as in the operator's TOML.
fn check_key(field: &str, k: &str) -> Result<(), String> {
    let ok = !k.is_empty()
        && k.len() <= MAX_SETTING_KEY
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(format!("{field}: key {k:?} must be 1-{MAX_SETTING_KEY} chars of [A-Za-z0-9._-]")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(values: &[(&str, &str)], secrets: &[(&str, &str)]) -> PluginSettings {
        let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        PluginSettings { values: map(values), secrets: map(secrets) }
    }

    #[test]
    fn limits() {
        assert!(settings(&[("on_409", "retry")], &[("api_key", "s")]).validate().is_ok());
        let long = "x".repeat(MAX_SETTING_VALUE + 1);
        #[rustfmt::skip]
        let bad = [
            (settings(&[("", "v")], &[]), "values: key"),
            (settings(&[("a b", "v")], &[]), "values: key"),
            (settings(&[], &[("k", &long)]), "secrets.k:"),
            (settings(&[("k", "a\0b")], &[]), "values.k:"),
            (settings(&[("k", "1")], &[("k", "2")]), "secrets.k:"),
        ];
        for (s, want) in bad {
            let err = s.validate().unwrap_err();
            assert!(err.starts_with(want), "{err} should start with {want}");
        }
        let many: Vec<(String, String)> = (0..=MAX_SETTINGS).map(|i| (format!("k{i}"), "v".into())).collect();
        let many = PluginSettings { values: many.into_iter().collect(), ..Default::default() };
        assert!(many.validate().unwrap_err().contains("at most 64 keys"));
    }

    #[test]
    fn merged_holds_values_and_secrets() {
        let m = settings(&[("a", "1")], &[("b", "2")]).merged();
        assert_eq!((m["a"].as_str(), m["b"].as_str(), m.len()), ("1", "2", 2));
    }
}
