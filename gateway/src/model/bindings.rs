//! Which plugins an endpoint binds to its hooks, and the names they are bound by:
//! `name` follows the plugin's serving version, `name@n` pins version `n`.

use serde::{Deserialize, Serialize};

/// Plugins bound to an endpoint, by name within its tenant.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PluginBindings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classify: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sign: Option<String>,
}

impl PluginBindings {
    pub fn is_empty(&self) -> bool {
        self.transform.is_none() && self.classify.is_none() && self.sign.is_none()
    }

    /// The bound names, hook by hook (`transform`, `classify`, `sign`), each as written:
    /// `name` or `name@n`.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        [&self.transform, &self.classify, &self.sign].into_iter().flatten().map(String::as_str)
    }

    /// Whether a hook binds plugin `name`, following it or pinned to a version of it.
    pub fn binds(&self, name: &str) -> bool {
        self.hooks_binding(name).next().is_some()
    }

    /// The hooks (`transform`, `classify`, `sign`) that bind plugin `name`, following it
    /// or pinned to a version of it.
    pub fn hooks_binding<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'static str> + 'a {
        let named = move |b: &str| b == name || split_pinned(b).is_some_and(|(base, _)| base == name);
        [("transform", &self.transform), ("classify", &self.classify), ("sign", &self.sign)]
            .into_iter()
            .filter(move |(_, bound)| bound.as_deref().is_some_and(&named))
            .map(|(hook, _)| hook)
    }

    /// The versions of plugin `name` that hooks pin (`name@n`), in hook order.
    pub fn pinned<'a>(&'a self, name: &'a str) -> impl Iterator<Item = u32> + 'a {
        self.iter().filter_map(move |b| split_pinned(b).filter(|(base, _)| *base == name).map(|(_, n)| n))
    }
}

/// A plugin (or config key) name: 1-64 of `[a-z0-9_-]`.
pub fn is_slug(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `name@n` → (`name`, n): a binding pinned to version `n` (from 1, no leading zero).
pub fn split_pinned(name: &str) -> Option<(&str, u32)> {
    let (base, n) = name.split_once('@')?;
    if n.starts_with('0') || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = n.parse().ok().filter(|n| *n > 0)?;
    is_slug(base).then_some((base, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bindings(transform: Option<&str>, classify: Option<&str>, sign: Option<&str>) -> PluginBindings {
        let s = |v: Option<&str>| v.map(str::to_string);
        PluginBindings { transform: s(transform), classify: s(classify), sign: s(sign) }
    }

    #[test]
    fn a_pinned_name_splits_only_when_it_is_a_slug_and_a_version() {
        assert_eq!(split_pinned("enrich@3"), Some(("enrich", 3)));
        for bad in ["enrich", "enrich@", "enrich@0", "enrich@03", "enrich@x", "Enrich@1", "@1", "enrich@4294967296"] {
            assert_eq!(split_pinned(bad), None, "{bad}");
        }
    }

    #[test]
    fn binds_follows_names_and_pins_of_every_hook_but_not_prefixes() {
        let b = bindings(Some("enrich"), Some("retry-409@2"), Some("enrich@4"));
        assert!(b.binds("enrich"));
        assert!(b.binds("retry-409"));
        assert!(!b.binds("retry"), "a prefix is another plugin");
        assert!(!b.binds("sign"));
        assert!(!PluginBindings::default().binds("enrich"));
    }

    #[test]
    fn pinned_lists_the_versions_pinned_for_one_name() {
        let b = bindings(Some("enrich@1"), Some("enrich"), Some("enrich@4"));
        assert_eq!(b.pinned("enrich").collect::<Vec<_>>(), vec![1, 4]);
        assert_eq!(b.pinned("other").count(), 0);
        assert_eq!(b.iter().collect::<Vec<_>>(), vec!["enrich@1", "enrich", "enrich@4"]);
    }
}
