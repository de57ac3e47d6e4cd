//! ARCHITECTURE.md's invariants as tests (rust-analyzer's tidy habit): each I/O library is
//! imported by the one module that owns it, so a stray `use` fails here, not in review.

use std::path::{Path, PathBuf};

/// (crate as written in a path, where under `gateway/src` it may appear).
const OWNERS: &[(&str, &[&str])] = &[
    ("wasmtime", &["plugin/"]),
    ("wasmtime_wasi", &["plugin/"]),
    ("sqlx", &["store/"]),
    ("rusqlite", &["store/"]),
    // The webhook client in `deliver`, the operator CLI's client, and the API's listener.
    ("hyper", &["deliver.rs", "deliver/", "cli.rs", "api/"]),
    ("hyper_util", &["deliver.rs", "deliver/", "cli.rs", "api/"]),
    ("axum", &["api/", "app.rs"]),
    // Span export: the SDK in `telemetry`, its HTTP client (Herald's hyper) in `deliver`.
    ("opentelemetry", &["telemetry.rs"]),
    ("opentelemetry_sdk", &["telemetry.rs"]),
    ("opentelemetry_otlp", &["telemetry.rs"]),
    ("opentelemetry_http", &["deliver/otlp.rs"]),
    // Each broker's client in its own destination submodule.
    ("redis", &["deliver/redis.rs"]),
    ("async_nats", &["deliver/nats.rs"]),
    ("lapin", &["deliver/amqp.rs"]),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read gateway/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines of `text` that name `krate` as a path root (`use krate::…`, `krate::x`), ignoring
/// comments.
fn mentions(text: &str, krate: &str) -> Vec<usize> {
    let needle = format!("{krate}::");
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            code.match_indices(&needle).any(|(at, _)| {
                // Not a suffix of a longer name (`hyper_util::` is not `util::`) or a path
                // segment (`crate::hyper::`).
                at == 0 || !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
            })
        })
        .map(|(n, _)| n + 1)
        .collect()
}

fn strays() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 20, "found only {} sources under {}", files.len(), root.display());
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).expect("under src").to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(&file).expect("read source");
        for (krate, owners) in OWNERS {
            if owners.iter().any(|o| rel.starts_with(o)) {
                continue;
            }
            for line in mentions(&text, krate) {
                found.push(format!("gateway/src/{rel}:{line} uses `{krate}`, owned by {owners:?}"));
            }
        }
    }
    found
}

#[test]
fn each_io_library_is_imported_by_its_owner_only() {
    let found = strays();
    assert!(found.is_empty(), "architecture invariants broken:\n{}", found.join("\n"));
}

#[test]
fn the_scan_sees_paths_and_ignores_comments() {
    assert_eq!(
        mentions("use wasmtime::Engine;\n// wasmtime::x\nlet e = wasmtime::Engine::default();", "wasmtime"),
        [1, 3]
    );
    assert_eq!(mentions("use hyper_util::rt;", "hyper"), Vec::<usize>::new());
    assert_eq!(mentions("crate::sqlx::x", "sqlx"), Vec::<usize>::new());
}

/// Herald's layers, lowest first (ARCHITECTURE.md, "Layers"): a module of `gateway/src`
/// may import (`crate::x`) only modules of lower layers. Modules of one layer never import
/// each other. `main.rs` and `lib.rs` sit above everything.
const LAYERS: &[&[&str]] = &[
    &["model"],
    &["clock"],
    &["schedule", "pace", "lease", "classify", "sign", "net"],
    &["spec"],
    &["store", "deliver", "plugin"],
    &["config"],
    &["metrics", "telemetry"],
    &["catalog"],
    &["intake"],
    &["ops"],
    &["worker"],
    &["outbox", "replay"],
    &["api"],
    &["app"],
    &["cli", "scaffold"],
];

/// The same rule inside a folder, for the files under it (`super::x` and
/// `crate::folder::x`): lowest first. Its `mod.rs` (or `folder.rs`) sits above them all.
const INNER: &[(&str, &[&[&str]])] = &[
    ("worker", &[&["known", "members"], &["decide", "signal"], &["attempt"], &["partition"]]),
    (
        "plugin",
        &[
            &["types", "convert"],
            &["inspect", "pool", "output"],
            &["engine", "artifacts"],
            &["sandbox"],
            &["ticker", "compile"],
            &["js"],
            &["runtime"],
            &["registry"],
            &["cli", "tests"],
        ],
    ),
    (
        "api",
        &[
            &["doc", "listen"],
            &["reach"],
            &["extract", "auth", "console"],
            &["bindings", "plugin_stats", "event_types"],
            &["endpoints", "events", "replays", "tenants", "test_send", "whoami", "portal"],
            &["plugins"],
            &["plugin_versions", "plugin_config", "insight"],
        ],
    ),
];

fn rank(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&module))
}

/// `path` segments right after each `prefix` on the code part of `text`'s lines:
/// (line, segment).
fn imported(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices(prefix) {
            if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
        }
    }
    found
}

/// Every import of a higher or same layer, as "file:line: a (layer i) imports b (layer j)".
fn upward_imports(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(root, &mut files);
    assert!(files.len() > 20, "found only {} sources under {}", files.len(), root.display());
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root).expect("under src").to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(&file).expect("read source");
        let parts: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
        let top = parts[0];
        if let Some(mine) = rank(LAYERS, top) {
            for (line, to) in imported(&text, "crate::") {
                match rank(LAYERS, &to) {
                    Some(theirs) if to != top && theirs >= mine => found
                        .push(format!("gateway/src/{rel}:{line}: {top} (layer {mine}) imports {to} (layer {theirs})")),
                    _ => {}
                }
            }
        }
        for (folder, order) in INNER {
            if parts[0] != *folder || parts.len() < 2 || parts[1] == "mod" {
                continue;
            }
            let me = parts[1];
            let Some(mine) = rank(order, me) else {
                found.push(format!("gateway/src/{rel}: {folder}/{me} has no place in the {folder}/ order"));
                continue;
            };
            // `super::` from a file directly under the folder, `super::super::` from one below.
            let up = "super::".repeat(parts.len() - 1);
            let mut seen = imported(&text, &up);
            seen.extend(imported(&text, &format!("crate::{folder}::")));
            for (line, to) in seen {
                match rank(order, &to) {
                    Some(theirs) if to != me && theirs >= mine => found
                        .push(format!("gateway/src/{rel}:{line}: {folder}/{me} imports {folder}/{to}, not below it")),
                    _ => {}
                }
            }
        }
    }
    found
}

#[test]
fn modules_import_only_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src");
    let found = upward_imports(&root);
    assert!(found.is_empty(), "imports against the layer order (ARCHITECTURE.md, \"Layers\"):\n{}", found.join("\n"));
}

/// The scan catches a planted upward import, at the top level and inside a folder.
#[test]
fn the_layer_scan_sees_a_planted_upward_import() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |rel: &str, text: &str| {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    for i in 0..20 {
        write(&format!("model/part{i}.rs"), "use crate::model::Millis;\n");
    }
    write("store.rs", "use crate::model::Millis;\n// crate::worker::Engine in a comment\n");
    write("intake.rs", "use crate::store::Committer;\n");
    write("worker/attempt.rs", "use super::decide::decide;\n");
    assert_eq!(upward_imports(dir.path()), Vec::<String>::new());
    write("store/writer.rs", "fn f() { crate::intake::fan_out(); }\n");
    write("worker/decide.rs", "use super::attempt::run;\n");
    let mut found = upward_imports(dir.path());
    found.sort();
    assert_eq!(
        found,
        [
            "gateway/src/store/writer.rs:1: store (layer 4) imports intake (layer 8)",
            "gateway/src/worker/decide.rs:1: worker/decide imports worker/attempt, not below it",
        ]
    );
}

/// Calls that would add a route to the API's router without its OpenAPI operation. Every
/// route goes through `api::routes` (`routes!` of handlers with `#[utoipa::path]`), so the
/// document lists every route the router serves (`contract.rs` checks the converse).
const UNDOCUMENTED_ROUTING: &[&str] = &[".route(", ".route_service(", ".nest(", ".nest_service(", ".merge("];

///
/// The one exception is the console (`api/console.rs`): static files, not API operations,
/// so they are not in the document; there every route must be a GET under `/console`.
#[test]
fn every_api_route_is_registered_with_its_openapi_operation() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src");
    let mut files = Vec::new();
    sources(&root.join("api"), &mut files);
    files.push(root.join("app.rs"));
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read source");
        let console = file.ends_with("api/console.rs");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let routing = UNDOCUMENTED_ROUTING.iter().any(|call| code.contains(call));
            if routing && !(console && console_route(code)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "routes added outside `api::routes` (not in /openapi.json):\n{}", found.join("\n"));
}

/// `.route("/console…", get(…))`: a static file of the console, read-only.
fn console_route(code: &str) -> bool {
    let code = code.trim();
    code.starts_with(".route(\"/console") && code.contains(", get(") && !code.contains(".nest")
}

#[test]
fn only_console_gets_pass_as_console_routes() {
    assert!(console_route(r#".route("/console/{file}", get(|| async { x }))"#));
    assert!(!console_route(r#".route("/v1/x", get(h))"#));
    assert!(!console_route(r#".route("/console", post(h))"#));
}

/// SQL that writes, in a string literal on one line of `text` (the statement's first line).
fn sql_writes(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            ["\"INSERT ", "\"UPDATE ", "\"DELETE ", "\"REPLACE "].iter().any(|w| code.contains(w))
        })
        .map(|(n, _)| n + 1)
        .collect()
}

/// On SQLite every write runs on the writer thread (`writer.rs`: group commits;
/// `writes.rs`: the rest, between them). A write in `mod.rs` would go through the pool and
/// queue for the file's lock behind the committer (the pool is read-only, so it would fail).
#[test]
fn sqlite_writes_run_on_the_writer_thread_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src/store/sqlite");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut found = Vec::new();
    for file in files {
        let name = file.file_name().expect("file name").to_string_lossy().to_string();
        if name == "writer.rs" || name == "writes.rs" {
            continue;
        }
        for line in sql_writes(&std::fs::read_to_string(&file).expect("read source")) {
            found.push(format!("gateway/src/store/sqlite/{name}:{line} writes outside the writer thread"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    assert_eq!(sql_writes("q(\"INSERT INTO t\")\n// \"DELETE FROM t\"\nq(\"SELECT 1\")"), [1]);
}

/// Each package of `cargo tree` with the features it is built with, as `name vX.Y.Z` →
/// the feature lists it appears with (a package built for the host and the target twice
/// may show two).
fn resolved_features(packages: &[&str]) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    cmd.args(["tree", "--offline", "--locked", "-e", "normal,build", "--prefix", "none", "-f", "{p}|{f}"]);
    for p in packages {
        // `--workspace` as given; a package's name after `-p`.
        if p.starts_with("--") {
            cmd.arg(p)
        } else {
            cmd.args(["-p", p])
        };
    }
    let out = cmd.output().expect("run cargo tree");
    assert!(out.status.success(), "cargo tree {packages:?}: {}", String::from_utf8_lossy(&out.stderr));
    let mut map = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim_end_matches(" (*)");
        let Some((package, features)) = line.split_once('|') else { continue };
        // `name vX (path)`: the name and version name the package; the path is noise.
        let key = package.split(' ').take(2).collect::<Vec<_>>().join(" ");
        map.entry(key).or_default().insert(features.to_string());
    }
    map
}

/// `cargo build --release -p gateway` (what `cargo run --release -p gateway` builds) and
/// the workspace's build (`cargo build --release`: gateway and tests, the bench's crate)
/// must build every dependency of the gateway with the same features. Resolver 3 unifies
/// features over the packages asked for, so a feature that only the tests crate turns on
/// (tempfile's `fastrand/default`) gave gateway's dependencies a second set: each command
/// then rebuilt the chain up to `herald` for minutes after the other, and the two wrote
/// `target/release/herald` in turn. `gateway/Cargo.toml` enables what the others add.
#[test]
fn the_gateway_alone_and_the_workspace_build_resolve_the_same_features() {
    let alone = resolved_features(&["gateway"]);
    for set in [&["gateway", "tests"][..], &["--workspace"]] {
        let together = resolved_features(set);
        let differ: Vec<String> = alone
            .iter()
            .filter(|(package, features)| together.get(*package) != Some(features))
            .map(|(package, features)| {
                format!("{package}: alone {features:?}, with {set:?} {:?}", together.get(package))
            })
            .collect();
        assert!(differ.is_empty(), "gateway's dependencies resolve differently:\n{}", differ.join("\n"));
    }
}
