//! The `herald` command line: `serve`, `replay`, `trigger`, `listen`, `apply`, `dump`, `plugin check|run` (and the hidden `plugin compile`), `check-config`, `outbox schema`, `openapi`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gateway::config::Config;

/// mimalloc rather than the system's allocator: per-thread free lists instead of glibc's
/// arenas. In `herald-bench fanout-tail` it gave 20-35% more deliveries/s at a fifth less
/// CPU each, and a 2M-delivery drain peaked at 388 MiB instead of 498. Measured and not
/// taken: mimalloc as C's `malloc` too (the crate's `override`, so SQLite's page cache uses
/// it): 6% less node CPU per delivery under `concurrent`, none in a 200k drain, which
/// peaked at 220 MiB instead of 187 (its size classes round SQLite's 4.3 KB pages up).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `herald --version`: the crate's version and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("HERALD_REVISION"), ")");

#[derive(Parser)]
#[command(name = "herald", version = VERSION, about = "A WebAssembly-extensible webhook delivery gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a Herald node (no --config: built-in defaults, SQLite in the working directory).
    Serve {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Replay dead letters of a tenant through a running Herald, with a progress bar.
    Replay(ReplayArgs),
    /// Post one real event of a tenant: the catalog's example of TYPE, or --data. It is
    /// fanned out, signed and delivered like any other event.
    Trigger(TriggerArgs),
    /// Receive a tenant's events on this machine: real deliveries of an endpoint of kind
    /// `listen`, signed as any push, forwarded to --forward over one outbound connection.
    /// Prints one line per delivery (status, latency, delivery, type, event, attempt).
    Listen(ListenArgs),
    /// Make a node's tenants, event types, plugin settings and endpoints what a YAML or TOML
    /// document says (docs/features/config-as-code.md). Prints what it changes, or "no changes".
    Apply(ApplyArgs),
    /// Print a node's tenants, event types, plugin settings and endpoints as the document
    /// `herald apply` takes, secrets as references.
    Dump(DumpArgs),
    /// A Model Context Protocol server on standard input and output, for an assistant:
    /// failing endpoints, deliveries and their attempts, dead letters and their replay,
    /// with one token's scopes (docs/features/mcp.md).
    Mcp(McpArgs),
    /// Work with plugin files: validate one, or run one hook on an input.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Validate a configuration file and print the effective settings.
    CheckConfig {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Transactional outbox: print the DDL a producer runs in its own database.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Print the API's OpenAPI 3.1 document (what `GET /openapi.json` serves), e.g. to
    /// generate a client without a running node.
    Openapi,
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// Herald's API address.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "HERALD_API")]
    api: String,
    /// A token with the `replay` scope (or the admin token).
    #[arg(long, env = "HERALD_TOKEN")]
    token: String,
    #[arg(long)]
    tenant: String,
    /// Explicit delivery ids (comma-separated); otherwise the filter below selects.
    #[arg(long, value_delimiter = ',')]
    ids: Vec<String>,
    #[arg(long)]
    endpoint: Option<String>,
    #[arg(long = "type")]
    event_type: Option<String>,
    #[arg(long)]
    reason: Option<String>,
    /// RFC 3339.
    #[arg(long)]
    since: Option<String>,
    /// RFC 3339.
    #[arg(long)]
    until: Option<String>,
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    #[arg(long, default_value_t = 100)]
    batch: u32,
    /// Return once the replay is accepted instead of following it.
    #[arg(long)]
    no_wait: bool,
    /// Replay every dead letter of the tenant (no ids, no filter). Without it such a
    /// replay is asked about on a terminal, and refused elsewhere.
    #[arg(long)]
    all: bool,
}

#[derive(clap::Args)]
struct McpArgs {
    /// Herald's API address.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "HERALD_API")]
    api: String,
    /// The token the assistant acts with: a tenant's (`read` to look, `replay` to replay)
    /// or the admin token. Its writes are in the audit log as its own.
    #[arg(long, env = "HERALD_TOKEN")]
    token: String,
}

#[derive(clap::Args)]
struct TriggerArgs {
    /// The event type, e.g. `invoice.paid`.
    #[arg(value_name = "TYPE")]
    event_type: String,
    /// Herald's API address.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "HERALD_API")]
    api: String,
    /// A token with the `events:write` scope, and `read` to look up the catalog's example
    /// (or the admin token).
    #[arg(long, env = "HERALD_TOKEN")]
    token: String,
    #[arg(long, env = "HERALD_TENANT")]
    tenant: String,
    /// The payload as JSON; without it (and without --data-file), the catalog's example.
    #[arg(long, conflicts_with = "data_file")]
    data: Option<String>,
    /// A file holding the payload as JSON (`-`: standard input).
    #[arg(long)]
    data_file: Option<PathBuf>,
    /// Which of the type's examples (1 is the first).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    example: u16,
    /// The event's id (`evt_…` is generated when absent); posting it again is answered as a
    /// duplicate, not delivered twice.
    #[arg(long)]
    id: Option<String>,
    /// For endpoints ordered by key.
    #[arg(long)]
    ordering_key: Option<String>,
}

#[derive(clap::Args)]
struct ListenArgs {
    /// The local URL each delivery is forwarded to, e.g. http://localhost:3000/hook.
    #[arg(long)]
    forward: String,
    /// Herald's API address: any node of the cluster.
    #[arg(long, visible_alias = "node", default_value = "http://127.0.0.1:8080", env = "HERALD_API")]
    api: String,
    /// A token of the tenant with the `manage` scope (or the admin token).
    #[arg(long, env = "HERALD_TOKEN")]
    token: String,
    #[arg(long, env = "HERALD_TENANT")]
    tenant: String,
    /// The event types to receive, comma-separated (`prefix.*` too); each must be in the
    /// tenant's catalog. None: every type.
    #[arg(long, value_delimiter = ',')]
    types: Vec<String>,
    /// Listen on this existing endpoint of kind `listen` instead of the one named --name.
    #[arg(long)]
    endpoint: Option<String>,
    /// The listener's name: its endpoint is `listen://NAME`, created when missing.
    /// Default: this machine's host name.
    #[arg(long)]
    name: Option<String>,
    /// Replay this dead letter (a delivery id) through the listener, then listen.
    #[arg(long, value_name = "DELIVERY_ID")]
    replay: Option<String>,
}

#[derive(clap::Args)]
struct ApplyArgs {
    /// The document: `.toml` is TOML, anything else YAML; `-` reads YAML from standard input.
    #[arg(long, short = 'f', value_name = "FILE")]
    file: PathBuf,
    /// Print the diff (+ created, ~ changed fields, - removed) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also remove the event types, plugin settings and endpoints of the document's tenants
    /// that it does not name.
    #[arg(long)]
    prune: bool,
    /// Herald's API address.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "HERALD_API")]
    api: String,
    /// The admin token.
    #[arg(long, env = "HERALD_TOKEN")]
    token: String,
}

#[derive(clap::Args)]
struct DumpArgs {
    #[arg(long, default_value = "yaml", value_parser = ["yaml", "toml"])]
    format: String,
    /// Herald's API address.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "HERALD_API")]
    api: String,
    /// The admin token.
    #[arg(long, env = "HERALD_TOKEN")]
    token: String,
}

#[derive(Subcommand)]
enum OutboxCommand {
    /// Print the outbox table, its indexes and its NOTIFY trigger (`config/outbox.sql`).
    Schema {
        /// The table's name (an unqualified identifier; the schema is the connection's
        /// search_path).
        #[arg(long, default_value = gateway::store::outbox::DEFAULT_TABLE)]
        table: String,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Compile and validate a plugin; print what it implements.
    Check { file: PathBuf },
    /// Run one hook of a plugin on a JSON input and print the result as JSON.
    Run {
        file: PathBuf,
        #[arg(long, value_parser = ["transform", "classify", "sign"])]
        hook: String,
        /// The hook's input (see `herald plugin run --help` and docs/plugins/rust.md).
        #[arg(long)]
        input: PathBuf,
    },
    /// Create a plugin project in `<dir>/<name>/` that builds, with a unit test.
    New {
        name: String,
        #[arg(long, value_parser = gateway::scaffold::LANGS)]
        lang: String,
        /// Where to create it.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The `plugin-sdk` crate to depend on (default: the one this binary was built with).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Compile a plugin into a cached artifact, within limits (the server runs this as a
    /// child process; exit code 2: not a valid component).
    #[command(hide = true)]
    Compile {
        /// Heap limit in bytes (RLIMIT_DATA).
        #[arg(long)]
        max_memory: u64,
        /// CPU time limit in seconds (RLIMIT_CPU).
        #[arg(long)]
        max_cpu_secs: u64,
        input: PathBuf,
        output: PathBuf,
    },
}

/// A failed command prints `error: ` and its causes on one line and exits 1. Never a stack
/// backtrace, whatever `RUST_BACKTRACE` says: the error is the user's to read (a plugin
/// refused, a setting out of range), not a bug; a panic still prints one. Symbolising a
/// backtrace also cost a refused `plugin check` 125 MB and, on a loaded machine, seconds.
fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `e` and its causes, `: `-separated, each said once: many of Herald's errors already end
/// with their source's text (`cannot read config file …: No such file or directory`).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.ends_with(&cause) {
            line = format!("{line}: {cause}");
        }
    }
    line
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { config } => serve(config.as_deref()),
        Command::Replay(args) => replay(args),
        Command::Trigger(args) => trigger(args),
        Command::Listen(args) => listen(args),
        Command::Apply(args) => apply(args),
        Command::Dump(args) => dump(args),
        Command::Mcp(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let stdin = std::io::BufReader::new(std::io::stdin());
            Ok(runtime.block_on(gateway::cli::mcp::serve(&args.api, &args.token, stdin, std::io::stdout()))?)
        }
        Command::Plugin { command } => plugin(command),
        Command::CheckConfig { config } => {
            let raw = gateway::config::RawConfig::check(config.as_deref(), std::env::vars())
                .context("invalid configuration")?;
            print_out(&raw.effective_keys())
        }
        Command::Outbox { command: OutboxCommand::Schema { table } } => {
            anyhow::ensure!(
                gateway::config::is_identifier(&table),
                "--table {table:?}: 1-48 chars of a-z, 0-9 or '_', starting with a letter or '_'"
            );
            print!("{}", gateway::store::outbox::schema_for(&table));
            Ok(())
        }
        Command::Openapi => print_out(gateway::api::openapi_json()),
    }
}

/// `herald dump`: the node's state as a document, on standard output.
fn dump(args: DumpArgs) -> anyhow::Result<()> {
    let format = match args.format.as_str() {
        "toml" => gateway::cli::document::Format::Toml,
        _ => gateway::cli::document::Format::Yaml,
    };
    let req = gateway::cli::dump::DumpRequest { api: args.api, token: args.token, format };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    print_out(runtime.block_on(gateway::cli::dump::dump(req))?.trim_end())
}

/// `herald plugin …`: check, run, scaffold and compile plugins, without a node.
fn plugin(command: PluginCommand) -> anyhow::Result<()> {
    match command {
        PluginCommand::Check { file } => {
            println!("{}", gateway::plugin::check_file(&file, &plugin_cli_config()?)?);
            Ok(())
        }
        PluginCommand::Run { file, hook, input } => {
            let input = std::fs::read_to_string(&input).with_context(|| format!("cannot read {}", input.display()))?;
            let run = gateway::plugin::run_hook_file(&file, &plugin_cli_config()?, &hook, &input);
            // A failed call prints its report too: what the plugin logged before it failed.
            if let Err(gateway::plugin::PluginError::Call { report, .. }) = &run {
                println!("{report}");
            }
            println!("{}", run?);
            Ok(())
        }
        PluginCommand::New { name, lang, dir, sdk: _ } if lang == "js" => {
            for file in gateway::scaffold::new_js_plugin(&dir, &name)? {
                println!("created {}", file.display());
            }
            println!("test it with `npm test` in {}", dir.join(&name).display());
            Ok(())
        }
        PluginCommand::Compile { max_memory, max_cpu_secs, input, output } => {
            match gateway::plugin::compile_child(&input, &output, max_memory, max_cpu_secs) {
                Ok(()) => Ok(()),
                Err(e @ gateway::plugin::PluginError::Invalid(_)) => {
                    eprintln!("{e}");
                    std::process::exit(gateway::plugin::EXIT_INVALID)
                }
                Err(e) => Err(e.into()),
            }
        }
        PluginCommand::New { name, lang, dir, sdk } => {
            let sdk = sdk.unwrap_or_else(gateway::scaffold::default_sdk);
            let root = gateway::scaffold::new_plugin(&lang, &name, &dir, &sdk)?;
            let wasm = format!("target/wasm32-wasip2/release/{}.wasm", name.replace('-', "_"));
            println!("created {}; `cargo test` runs its test, then", root.display());
            println!("  cargo build --release --target wasm32-wasip2 && herald plugin check {wasm}");
            println!("  herald plugin run {wasm} --hook transform --input input.json");
            Ok(())
        }
    }
}

/// Prints `text` and a newline on stdout. A reader that went away (`herald openapi | head`)
/// ends the output quietly: a broken pipe is not an error of ours, and `println!` would panic.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn serve(config: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut config = Config::load(config, std::env::vars()).context("invalid configuration")?;
    init_logging(&config);
    if config.admin_token.is_none() {
        tracing::warn!(
            "no admin token is set (server.admin_token or HERALD_SERVER_ADMIN_TOKEN, at least 32 characters): \
             every admin route (/v1/tenants, tokens, the console's admin sign-in) answers 401 until one is"
        );
    }
    // Compile plugins in a child of this very binary (memory limit, timeout).
    config.plugins.compiler_exe = Some(std::env::current_exe().context("cannot find the herald binary")?);
    // Room for every connection the configuration allows at once (intake, deliveries in
    // flight and as many idle, the store's), made before the runtime's threads exist.
    let slots = config.server.max_connections + 2 * config.delivery.max_in_flight_total;
    gateway::app::reserve_fd_table(slots + config.store_max_connections as usize + 256);
    // One runtime for the API and the engine. Measured and not taken: the engine on a
    // current-thread runtime of its own (no work-stealing wake-ups between the workers) cost
    // nothing less at 500 events/s, and under `concurrent` its one thread fell behind intake
    // (202 → arrival p99 13–53 ms against 3–4 ms): intake's yield to delivery works only
    // within one runtime.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = config.worker_threads {
        runtime.worker_threads(n);
    }
    let runtime = runtime.enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        gateway::app::run(config, listener, shutdown_signal()).await?;
        anyhow::Ok(())
    })
}

fn trigger(args: TriggerArgs) -> anyhow::Result<()> {
    let text = match (&args.data, &args.data_file) {
        (Some(text), _) => Some(("--data".to_string(), text.clone())),
        (None, Some(path)) if path.as_os_str() == "-" => Some((
            "--data-file -".to_string(),
            std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?,
        )),
        (None, Some(path)) => Some((
            format!("--data-file {}", path.display()),
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?,
        )),
        (None, None) => None,
    };
    let payload = match text {
        Some((from, text)) => Some(serde_json::from_str(&text).with_context(|| format!("{from}: not JSON"))?),
        None => None,
    };
    let req = gateway::cli::TriggerRequest {
        api: args.api,
        token: args.token,
        tenant: args.tenant,
        event_type: args.event_type.clone(),
        payload,
        example: usize::from(args.example) - 1,
        id: args.id,
        ordering_key: args.ordering_key,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let accepted = runtime.block_on(gateway::cli::trigger(req))?;
    let (id, deliveries) = (accepted["id"].as_str().unwrap_or_default(), &accepted["deliveries"]);
    match accepted["duplicate"].as_bool() {
        Some(true) => eprintln!("{id} ({}) was posted before: answered, not delivered again", args.event_type),
        _ => eprintln!("{id} ({}) accepted: {deliveries} deliveries", args.event_type),
    }
    print_out(&accepted.to_string())
}

/// `herald listen`: runs until stopped (Ctrl-C), or fails on what it cannot take.
fn listen(args: ListenArgs) -> anyhow::Result<()> {
    let name = args.name.unwrap_or_else(gateway::app::host_name);
    let req = gateway::cli::listen::ListenRequest {
        api: args.api,
        token: args.token,
        tenant: args.tenant,
        forward: args.forward,
        types: args.types,
        endpoint: args.endpoint,
        name,
        replay: args.replay,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        tokio::select! {
            done = gateway::cli::listen::listen(req) => done.map_err(anyhow::Error::from),
            _ = shutdown_signal() => Ok(()),
        }
    })
}

fn apply(args: ApplyArgs) -> anyhow::Result<()> {
    let req = gateway::cli::apply::ApplyRequest {
        api: args.api,
        token: args.token,
        file: args.file,
        dry_run: args.dry_run,
        prune: args.prune,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let plan = runtime.block_on(gateway::cli::apply::apply(&req))?;
    match (plan.steps.is_empty(), req.dry_run) {
        (true, _) => println!("no changes"),
        (false, true) => println!("{}(dry run: nothing written)", plan.diff()),
        (false, false) => println!("{} change(s) applied", plan.steps.len()),
    }
    Ok(())
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let mut filter = serde_json::Map::new();
    let selection = [
        ("endpoint", args.endpoint),
        ("type", args.event_type),
        ("reason", args.reason),
        ("since", args.since),
        ("until", args.until),
    ];
    for (k, v) in selection {
        if let Some(v) = v {
            filter.insert(k.into(), v.into());
        }
    }
    let req = gateway::cli::ReplayRequest {
        api: args.api,
        token: args.token,
        tenant: args.tenant,
        ids: args.ids,
        filter: filter.into(),
        rate_per_sec: args.rate,
        batch: args.batch,
        wait: !args.no_wait,
        all: args.all,
    };
    gateway::cli::confirm(&req)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = runtime.block_on(gateway::cli::replay(req))?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log_level));
    // Colour only on a terminal: a log file or a pipe gets plain text, no escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if config.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down");
}

/// The plugin host's settings for `plugin check` and `plugin run`.
fn plugin_cli_config() -> anyhow::Result<gateway::plugin::PluginConfig> {
    gateway::config::plugin_cli_config().map_err(anyhow::Error::msg)
}
