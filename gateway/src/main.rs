//! The `herald` command line: `serve`, `plugin check|run`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gateway::config::Config;

#[derive(Parser)]
#[command(name = "herald", version, about = "A WebAssembly-extensible webhook delivery gateway")]
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
    /// Validate a configuration file and print the effective settings.
    CheckConfig {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => {
            let config = Config::load(config.as_deref(), std::env::vars()).context("invalid configuration")?;
            init_logging(&config);
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                let listener = tokio::net::TcpListener::bind(config.listen)
                    .await
                    .with_context(|| format!("cannot listen on {}", config.listen))?;
                gateway::app::run(config, listener, shutdown_signal()).await?;
                anyhow::Ok(())
            })
        }
        Command::CheckConfig { config } => {
            let config = Config::load(config.as_deref(), std::env::vars()).context("invalid configuration")?;
            println!("{config:#?}");
            Ok(())
        }
    }
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log_level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
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
