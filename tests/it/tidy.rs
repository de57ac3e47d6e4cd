//! ARCHITECTURE.md's invariants as tests (rust-analyzer's tidy habit): each I/O library is
//! imported by the one module that owns it, so a stray `use` fails here, not in review. And
//! the docs hold together: every link of README.md, ARCHITECTURE.md and docs/ resolves.

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

/// Writes `text` to `rel` under `root`, making the folders on the way.
fn plant(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The scan catches a planted upward import, at the top level and inside a folder.
#[test]
fn the_layer_scan_sees_a_planted_upward_import() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |rel: &str, text: &str| plant(dir.path(), rel, text);
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
/// so they are not in the document; there every route must be a GET under `/console` (or
/// `/` and `/favicon.ico`, which send a browser to the console's page and icon).
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

/// `.route("/console…", get(…))`: a static file of the console, read-only; or `/` and
/// `/favicon.ico`, read-only too.
fn console_route(code: &str) -> bool {
    let code = code.trim();
    let path = [".route(\"/console", ".route(\"/\", ", ".route(\"/favicon.ico\", "].iter().any(|p| code.starts_with(p));
    path && code.contains(", get(") && !code.contains(".nest")
}

#[test]
fn only_console_gets_pass_as_console_routes() {
    assert!(console_route(r#".route("/console/{file}", get(|| async { x }))"#));
    assert!(!console_route(r#".route("/v1/x", get(h))"#));
    assert!(!console_route(r#".route("/console", post(h))"#));
    assert!(console_route(r#".route("/", get(|| async { x }))"#));
    assert!(!console_route(r#".route("/", post(h))"#));
    assert!(!console_route(r#".route("/v2", get(h))"#));
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

// The docs: README.md, ARCHITECTURE.md and the pages under docs/ (see README, "Read next").

/// The pages whose links are checked: README.md, ARCHITECTURE.md and every `.md` under `docs/`.
fn doc_pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read docs/") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// A page's lines outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let start = line.trim_start();
        if start.starts_with("```") || start.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// GitHub's anchor for a heading: lower case, spaces as `-`, every character but letters,
/// digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    let kept = heading.trim().chars().filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'));
    kept.map(|c| if c == ' ' { '-' } else { c }).flat_map(char::to_lowercase).collect()
}

/// The anchors of a page's headings (a repeated heading gets `-1`, `-2`, … as on GitHub).
fn anchors(text: &str) -> std::collections::HashSet<String> {
    let mut seen = std::collections::HashSet::new();
    for (_, line) in prose(text) {
        let level = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[level..]);
        let (mut name, mut n) = (base.clone(), 0);
        while !seen.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
    }
    seen
}

/// A page's relative link targets (`[text](target)`, not in code), with their lines.
fn relative_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    for (n, line) in prose(text) {
        // What lies between backticks is code, never a link.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                links.push((n, target.to_string()));
            }
            rest = &rest[end..];
        }
    }
    links
}

/// Every relative link of the doc pages that does not resolve (no such file, or no heading
/// for its `#anchor`), and every page under `docs/` that no chain of links from README.md
/// reaches.
fn doc_link_problems(root: &Path) -> Vec<String> {
    let root = std::fs::canonicalize(root).expect("the repository's root");
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let show = |path: &Path| path.strip_prefix(&root).unwrap_or(path).display().to_string();
    let (mut problems, mut edges) = (Vec::new(), Vec::new());
    for page in doc_pages(&root) {
        for (n, target) in relative_links(&read(&page)) {
            let (file, fragment) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
            let linked = if file.is_empty() { page.clone() } else { page.parent().expect("a dir").join(file) };
            let Ok(linked) = std::fs::canonicalize(&linked) else {
                problems.push(format!("{}:{n}: ({target}): no such file", show(&page)));
                continue;
            };
            let markdown = linked.extension().is_some_and(|e| e == "md");
            if let Some(fragment) = fragment.filter(|_| markdown)
                && !anchors(&read(&linked)).contains(fragment)
            {
                problems.push(format!("{}:{n}: ({target}): no heading #{fragment} in {}", show(&page), show(&linked)));
            }
            if markdown {
                edges.push((page.clone(), linked));
            }
        }
    }
    let mut reached = std::collections::HashSet::from([root.join("README.md")]);
    let mut queue = vec![root.join("README.md")];
    while let Some(page) = queue.pop() {
        for (_, to) in edges.iter().filter(|(from, _)| *from == page) {
            if reached.insert(to.clone()) {
                queue.push(to.clone());
            }
        }
    }
    let docs = root.join("docs");
    for page in doc_pages(&root).into_iter().filter(|p| p.starts_with(&docs) && !reached.contains(p)) {
        problems.push(format!("{}: no chain of links from README.md reaches it", show(&page)));
    }
    problems
}

/// Every relative link in README.md, ARCHITECTURE.md and docs/ resolves, to a file and, when
/// it names one, to a heading of that page; and every page under docs/ is reachable from
/// README.md by links, so a reader can find it.
#[test]
fn every_doc_link_resolves_and_every_docs_page_is_reachable_from_the_readme() {
    let problems = doc_link_problems(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    assert!(problems.is_empty(), "the docs' links:\n{}", problems.join("\n"));
}

/// The link check sees a planted missing file, a missing heading and an orphan page, and
/// nothing in code.
#[test]
fn the_link_check_sees_a_planted_broken_link_and_an_orphan_page() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |rel: &str, text: &str| plant(dir.path(), rel, text);
    write("README.md", "# Herald\n\nSee [ops](docs/ops.md#shut-down-a-node) and [`a`](docs/ops.md).\n");
    write("ARCHITECTURE.md", "## Map\n\n[up](#map), `[no](missing.md)`\n\n```\n[no](missing.md)\n```\n");
    write("docs/ops.md", "# Ops\n\n## Shut down a node\n\n[Back](../README.md#herald), [sub](sub/plugins.md)\n");
    write("docs/sub/plugins.md", "# Plugins\n\n## 1. The `Plugin` trait\n\n[here](#1-the-plugin-trait)\n");
    assert_eq!(doc_link_problems(dir.path()), Vec::<String>::new());
    write("ARCHITECTURE.md", "## Map\n\n[gone](docs/gone.md) and [deep](docs/ops.md#nowhere)\n");
    write("docs/orphan.md", "# Nobody links here\n");
    assert_eq!(
        doc_link_problems(dir.path()),
        [
            "ARCHITECTURE.md:3: (docs/gone.md): no such file",
            "ARCHITECTURE.md:3: (docs/ops.md#nowhere): no heading #nowhere in docs/ops.md",
            "docs/orphan.md: no chain of links from README.md reaches it",
        ]
    );
}

/// `.ci/run` runs the very command README.md gives for running the tests.
#[test]
fn ci_runs_the_test_command_the_readme_gives() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let section = readme.split("\n## Running the tests\n").nth(1).expect("README: \"## Running the tests\"");
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("\n```").next());
    let command = block.expect("README: a sh block under \"Running the tests\"").trim();
    let ci = std::fs::read_to_string(root.join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == format!("exec {command}")),
        "README runs the tests with `{command}`; .ci/run:\n{ci}"
    );
}
