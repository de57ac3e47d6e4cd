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
fn tracing_is_off_unless_an_endpoint_is_set() {
    assert!(Config::load(None, Vec::new()).unwrap().tracing.is_none());
    let c = load("[tracing]\nsample_ratio = 0.25\n", &[("HERALD_TRACING_OTLP_ENDPOINT", "http://127.0.0.1:4318")]);
    let t = c.unwrap().tracing.unwrap();
    assert_eq!((t.otlp_endpoint.as_str(), t.sample_ratio), ("http://127.0.0.1:4318/v1/traces", 0.25));
    let t = load("[tracing]\notlp_endpoint = \"https://c.example/otlp/traces\"\n", &[]).unwrap().tracing.unwrap();
    assert_eq!(t.otlp_endpoint.as_str(), "https://c.example/otlp/traces", "a path is kept");
}

#[test]
fn env_overrides_file() {
    let c = load(
        "[server]\nlisten = \"127.0.0.1:1\"\n",
        &[
            ("HERALD_SERVER_LISTEN", "127.0.0.1:9000"),
            ("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "true"),
            ("HERALD_SERVER_ADMIN_TOKEN", LONG_TOKEN),
            ("HERALD_SERVER_WORKER_THREADS", "1"),
            ("PATH", "/bin"),
        ],
    )
    .unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
    assert_eq!(c.worker_threads, Some(1));
    assert!(c.delivery.allow_private_destinations);
    assert_eq!(c.admin_token.as_ref().map(Redacted::expose), Some(LONG_TOKEN));
}

const LONG_TOKEN: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn client_variables_are_not_config_keys() {
    let c = load("", &[("HERALD_TOKEN", "hrld_x"), ("HERALD_API", "http://127.0.0.1:1"), ("HERALD_TENANT", "acme")])
        .unwrap();
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
        ("[server]\nbody_read_timeout = \"0s\"\n", &[], "server.body_read_timeout"),
        ("", &[("HERALD_SERVER_BODY_READ_TIMEOUT", "soon")], "server.body_read_timeout"),
        ("[server]\nmax_connections = 0\n", &[], "server.max_connections"),
        ("[server]\nadmin_listen = \"localhost\"\n", &[], "server.admin_listen"),
        ("", &[("HERALD_SERVER_ADMIN_LISTEN", "127.0.0.1:port")], "server.admin_listen"),
        ("[server]\nworker_threads = 5000\n", &[], "server.worker_threads"),
        ("", &[("HERALD_SERVER_WORKER_THREADS", "-1")], "server.worker_threads"),
        ("[store]\nmax_connections = \"eight\"\n", &[], "store.max_connections"),
        ("[plugins]\nmax_tenant_bytes = 1000\n", &[], "plugins.max_tenant_bytes"),
        ("[plugins]\ncompile_timeout = \"soon\"\n", &[], "plugins.compile_timeout"),
        ("[plugins]\nwarm_idle = \"idle\"\n", &[], "plugins.warm_idle"),
        ("[cluster]\nnode_id = \"a b\"\n", &[], "cluster.node_id"),
        ("[tracing]\nsample_ratio = 1.5\n", &[], "tracing.sample_ratio"),
        ("", &[("HERALD_TRACING_OTLP_ENDPOINT", "collector:4318")], "tracing.otlp_endpoint"),
        ("", &[("HERALD_TRACING_OTLP_ENDPOINT", "ftp://collector")], "tracing.otlp_endpoint"),
        (
            "",
            &[("HERALD_CLUSTER_NODE_ID", "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn")],
            "cluster.node_id",
        ),
    ];
    for (toml, env, key) in cases {
        let err = load(toml, env).unwrap_err().to_string();
        assert!(err.contains(key), "{toml:?} {env:?}: {err}");
        // A value a variable set is named by the variable too (issue 48 §14).
        for (var, _) in env.iter() {
            assert!(err.contains(var), "{env:?}: the error does not name {var}: {err}");
        }
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

#[test]
fn tenant_plugin_limits_fall_back_to_the_globals() {
    let c = load(
        "[plugins]\nmax_plugin_bytes = 1000\nmax_tenant_bytes = 5000\n\
         [plugins.tenant.js-heavy]\njs_memory_limit_mib = 512\ncall_timeout = \"50ms\"\nmax_plugins = 3\n\
         [plugins.tenant.big]\nmax_plugin_bytes = 20000\nmax_tenant_bytes = 40000\nmemory_limit_mib = 32\n",
        &[],
    )
    .unwrap();
    let p = &c.plugins;
    let heavy = p.limits("js-heavy");
    assert_eq!(heavy.js_memory_limit, 512 << 20);
    assert_eq!(heavy.call_timeout, Duration::from_millis(50));
    assert_eq!(heavy.max_plugins, 3);
    // Unset keys follow [plugins].
    assert_eq!((heavy.memory_limit, heavy.max_plugin_bytes, heavy.max_tenant_bytes), (16 << 20, 1000, 5000));
    assert_eq!(heavy.call_timeout_per_mib, p.call_timeout_per_mib);
    let big = p.limits("big");
    assert_eq!((big.max_plugin_bytes, big.max_tenant_bytes, big.memory_limit), (20000, 40000, 32 << 20));
    assert_eq!(p.limits("other"), p.limits(""), "a tenant without a table has the globals");
    assert_eq!(p.limits("other").max_plugins, 20);
    // The instance pool reserves for the largest cap of any tenant.
    assert_eq!(p.max_memory(), 512 << 20);
    assert_eq!(p.limit_key("big", "max_plugin_bytes"), "plugins.tenant.big.max_plugin_bytes");
    assert_eq!(p.limit_key("big", "max_plugins"), "plugins.max_plugins_per_tenant");
    assert_eq!(p.limit_key("js-heavy", "max_plugins"), "plugins.tenant.js-heavy.max_plugins");
    // The variable sets the whole table, like any other key.
    let c = load(
        "[plugins.tenant.big]
max_plugins = 2
",
        &[("HERALD_PLUGINS_TENANT", "{tiny = {max_plugin_bytes = 10}}")],
    )
    .unwrap();
    assert_eq!(c.plugins.limits("tiny").max_plugin_bytes, 10);
    assert_eq!(c.plugins.limits("big").max_plugins, 20);
}

#[test]
fn bad_tenant_plugin_limits_name_the_key() {
    let cases: &[(&str, &str)] = &[
        ("[plugins.tenant.acme]\ncall_timeout = \"fast\"\n", "plugins.tenant.acme.call_timeout"),
        ("[plugins.tenant.acme]\ncall_timeout = \"0s\"\n", "plugins.tenant.acme.call_timeout"),
        ("[plugins.tenant.acme]\ncall_timeout_per_mib = \"x\"\n", "plugins.tenant.acme.call_timeout_per_mib"),
        ("[plugins.tenant.acme]\nmemory_limit_mib = 0\n", "plugins.tenant.acme.memory_limit_mib"),
        ("[plugins.tenant.acme]\njs_memory_limit_mib = 5000\n", "plugins.tenant.acme.js_memory_limit_mib"),
        ("[plugins.tenant.acme]\nmax_plugin_bytes = 0\n", "plugins.tenant.acme.max_plugin_bytes"),
        // It must fit one plugin, with its own or the global values.
        ("[plugins.tenant.acme]\nmax_plugins = 0\n", "plugins.tenant.acme.max_tenant_bytes"),
        ("[plugins.tenant.acme]\nmax_tenant_bytes = 1000\n", "plugins.tenant.acme.max_tenant_bytes"),
        ("[plugins.tenant.acme]\nmax_plugin_bytes = 40000000\n", "plugins.tenant.acme.max_tenant_bytes"),
        ("[plugins.tenant.Acme]\nmax_plugins = 2\n", "plugins.tenant.Acme"),
        ("[plugins.tenant.acme]\nmax_plugin = 2\n", "max_plugin"),
    ];
    for (toml, key) in cases {
        let err = load(toml, &[]).unwrap_err().to_string();
        assert!(err.contains(key), "{toml:?}: {err}");
    }
    let err = load("[plugins.tenant.acme]\nmax_tenant_bytes = 1000\n", &[]).unwrap_err().to_string();
    assert!(err.contains("must fit at least one plugin"), "{err}");
}

#[test]
fn the_plugin_directories_default_to_beside_the_data() {
    let dirs = |toml: &str| {
        let p = load(toml, &[]).unwrap().plugins;
        (p.dir, p.cache_dir.unwrap_or_default())
    };
    let beside = |dir: &str| (Path::new(dir).join("plugins.d"), Path::new(dir).join("plugins.cache"));
    assert_eq!(dirs("[store]\nurl = \"sqlite:///var/lib/herald/herald.db?mode=rwc\"\n"), beside("/var/lib/herald"));
    assert_eq!(dirs("[store]\nurl = \"sqlite://data/herald.db\"\n"), beside("data"));
    assert_eq!(dirs(""), beside("."), "sqlite://herald.db is in the working directory");
    assert_eq!(dirs("[store]\nurl = \"postgres://h/db\"\n"), beside("."));
    let set = "[plugins]\ndir = \"/srv/p\"\ncache_dir = \"/srv/c\"\n[store]\nurl = \"sqlite:///d/h.db\"\n";
    assert_eq!(dirs(set), (PathBuf::from("/srv/p"), PathBuf::from("/srv/c")));
}
