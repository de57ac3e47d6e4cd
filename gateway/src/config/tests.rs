//! Loading, overrides, validation errors and the example file.

use super::*;

fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, toml).unwrap();
    Config::load(Some(&path), env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn defaults_without_a_file() {
    let c = Config::load(None, Vec::new()).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(&*c.store_url, "sqlite://herald.db");
    assert_eq!(c.delivery.timeout, Duration::from_secs(10));
    assert_eq!(c.delivery.connect_timeout, Duration::from_secs(3));
    // The instance pool is sized from the limits: calls in flight, loads, and as
    // many warm instances again.
    assert_eq!(c.plugins.max_instances, 2 * (1024 + 1 + 16));
    assert!(c.admin_token.is_none());
    assert!(!c.delivery.allow_private_destinations);
}

#[test]
fn env_overrides_file() {
    let c = load(
        "[server]\nlisten = \"127.0.0.1:1\"\n",
        &[
            ("HERALD_SERVER_LISTEN", "127.0.0.1:9000"),
            ("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "true"),
            ("HERALD_SERVER_ADMIN_TOKEN", LONG_TOKEN),
            ("PATH", "/bin"),
        ],
    )
    .unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
    assert!(c.delivery.allow_private_destinations);
    assert_eq!(c.admin_token.as_ref().map(Redacted::expose), Some(LONG_TOKEN));
}

const LONG_TOKEN: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn client_variables_are_not_config_keys() {
    let c = load("", &[("HERALD_TOKEN", "hrld_x"), ("HERALD_API", "http://127.0.0.1:1")]).unwrap();
    assert!(c.admin_token.is_none());
}

#[test]
fn debug_output_shows_no_secret() {
    let whsec = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0";
    let c = load(
        "",
        &[
            ("HERALD_SERVER_ADMIN_TOKEN", LONG_TOKEN),
            ("HERALD_OPERATOR_URL", "https://ops.example.com/hook"),
            ("HERALD_OPERATOR_SECRET", whsec),
            ("HERALD_STORE_URL", "postgres://herald:pg-pass-1@127.0.0.1/db?password=pg-pass-2"),
        ],
    )
    .unwrap();
    let printed = format!("{c:#?} {}", c.store_url);
    for secret in [LONG_TOKEN, whsec, "pg-pass-1", "pg-pass-2"] {
        assert!(!printed.contains(secret), "{secret} printed in {printed}");
    }
    assert!(printed.contains("postgres://herald:***@127.0.0.1/db"), "{printed}");
    assert_eq!(&*c.store_url, "postgres://herald:pg-pass-1@127.0.0.1/db?password=pg-pass-2");
}

/// TOML text, environment overrides, and the key the error must name.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

#[test]
fn errors_name_the_key() {
    let cases: &[Case<'_>] = &[
        ("[delivery]\ntimeout = \"ten\"\n", &[], "delivery.timeout"),
        ("[delivery]\ntimeout = \"60s\"\n", &[], "delivery.timeout"),
        ("[delivery]\ntimeout = \"18446744073709552s\"\n", &[], "delivery.timeout"),
        ("[retry]\nttl = \"10000000000000000s\"\n", &[], "retry.ttl"),
        ("[delivery]\nconnect_timeout = \"20s\"\n", &[], "delivery.connect_timeout"),
        ("[server]\nlisten = \"nowhere\"\n", &[], "server.listen"),
        ("[server]\nlisten_on = \"x\"\n", &[], "listen_on"),
        ("[retry]\njitter = \"sometimes\"\n", &[], "retry.jitter"),
        ("[store]\nurl = \"mysql://x\"\n", &[], "store.url"),
        ("[store]\nurl = \"sqlite::memory:\"\n", &[], "store.url"),
        ("", &[("HERALD_SERVER_NOPE", "1")], "HERALD_SERVER_NOPE"),
        ("", &[("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "maybe")], "HERALD_DELIVERY"),
        ("[server]\nadmin_token = \"short\"\n", &[], "server.admin_token"),
        ("", &[("HERALD_SERVER_ADMIN_TOKEN", &LONG_TOKEN[1..])], "server.admin_token"),
        ("[server]\nidle_timeout = \"0s\"\n", &[], "server.idle_timeout"),
        ("[server]\nheader_read_timeout = \"soon\"\n", &[], "server.header_read_timeout"),
        ("[server]\nmax_connections = 0\n", &[], "server.max_connections"),
        ("[plugins]\nmax_tenant_bytes = 1000\n", &[], "plugins.max_tenant_bytes"),
        ("[plugins]\ncompile_timeout = \"soon\"\n", &[], "plugins.compile_timeout"),
        ("[plugins]\nwarm_idle = \"idle\"\n", &[], "plugins.warm_idle"),
    ];
    for (toml, env, key) in cases {
        let err = load(toml, env).unwrap_err().to_string();
        assert!(err.contains(key), "{toml:?} {env:?}: {err}");
    }
}

#[test]
fn example_file_is_valid_and_matches_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/herald.example.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let from_file: toml::Table = text.parse().unwrap();
    let defaults = toml::Table::try_from(RawConfig::default()).unwrap();
    // Every key is documented, with its default value.
    for (section, keys) in &defaults {
        // `[[outbox]]` has no default entry; `outbox_example_documents_every_key` checks it.
        let Some(keys) = keys.as_table() else { continue };
        for (key, value) in keys {
            let documented = from_file.get(section).and_then(|s| s.get(key));
            assert_eq!(documented, Some(value), "{section}.{key}");
        }
    }
    Config::load(Some(&path), Vec::new()).unwrap();
}

#[test]
fn outbox_example_documents_every_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/herald.example.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    // The example source is commented out; uncommented, it is a valid source whose keys
    // show their defaults.
    let block: String = text
        .lines()
        .skip_while(|l| !l.starts_with("# [[outbox]]"))
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.strip_prefix("# ").unwrap_or("").to_string() + "\n")
        .collect();
    let doc: toml::Table = block.parse().unwrap();
    let source = &doc["outbox"].as_array().unwrap()[0];
    let defaults = toml::Table::try_from(RawOutbox::default()).unwrap();
    for (key, value) in &defaults {
        let documented = source.get(key);
        assert!(documented.is_some(), "outbox.{key} is not documented");
        if !matches!(key.as_str(), "name" | "url" | "tenant" | "tenant_map") {
            assert_eq!(documented, Some(value), "outbox.{key}");
        }
    }
    let raw: RawConfig = toml::Value::Table(doc).try_into().unwrap();
    assert_eq!(raw.validate().unwrap().outbox.len(), 1);
}
